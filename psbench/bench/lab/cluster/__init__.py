"""`psbench run --cluster cluster.toml`: one run whose roles (PS servers, workers, DDP nodes) are
placed on the hosts a cluster file names; results land in results/<suite>/<run-id>/ like any run.
The file (file.py: its format, read and checked), the roles it plans (roles.py), the hosts they
run on behind one interface (hosts.py: local, netns, ssh), the records collected from their files
(records.py) and the run itself (run.py)."""
