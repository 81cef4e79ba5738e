"""torch.distributed DistributedDataParallel over gloo: the allreduce baseline."""
