"""The harness (harness/), reports (report/), host lab (lab/), scale model (sim/), regression
check (regress/) and, on top of them, the CLI (cli.py)."""
