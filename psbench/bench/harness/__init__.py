"""Run the harness: a RunSpec matrix from an experiment file, runs, records on disk."""
