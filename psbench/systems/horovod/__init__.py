"""Real Horovod (horovod.torch, gloo controller) launched with horovodrun."""
