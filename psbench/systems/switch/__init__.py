"""Strategy-Switch: synchronous allreduce first, then asynchronous PS from the same weights."""
