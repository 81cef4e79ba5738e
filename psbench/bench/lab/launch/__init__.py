"""`psbench launch`: one process per rank, started by an engine (torchrun, Slurm's srun, Open MPI's
mpirun). Its rank and rendezvous come from the engine's environment (env.py), its role from its
rank (env.py), the ranks meet and exchange files and clock offsets through one TCPStore
(rendezvous.py), Horovod's ranks get what horovodrun would give them (horovod.py), and rank 0 writes
the run folder as a local run's (run.py)."""
