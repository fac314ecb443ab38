"""Launcher integration: who started us (mpirun/bfrun, MPICH, horovodrun, torchrun,
Slurm) and the torch.distributed process group. The job templates for clusters beside
this file (templates/) are the repository's, for users to copy; a wheel leaves them out."""
