"""Launcher integration: who started us (mpirun/bfrun, MPICH, horovodrun, torchrun,
Slurm), the torch.distributed process group, and job templates for clusters."""
