"""The folder put first on PYTHONPATH for Horovod's synthetic benchmark (horovod_script.py): its
`torchvision` package stands in for the real one."""
