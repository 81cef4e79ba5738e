"""A stand-in for torchvision, put first on PYTHONPATH when Horovod's synthetic benchmark runs
(horovod_script.py): that script imports only `torchvision.models`, and the real torchvision does
not load beside this CPU build of torch (its compiled operators are a CUDA build's)."""
