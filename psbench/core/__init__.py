"""The core every layer builds on; it imports nothing from workloads, systems or bench."""
