"""Launcher integration: who started us (mpirun/bfrun, MPICH, horovodrun, torchrun,
Slurm) and the torch.distributed process group; the lost-machine policy (lost_machine)
and the front that lets Open MPI 4 command lines run on Open MPI 5 (mpirun_front). The
job templates for clusters beside this file (templates/) are the repository's, for
users to copy; a wheel leaves them out."""
