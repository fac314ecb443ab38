"""`commbench sweep`: a scaling study on this machine in one command.

Every combination of worker count and strategy runs as its own job through a real
launcher (the `mpiexec` that the `mpi` extra installs, or `torchrun`), each with a
timeout; then the report and the charts of exactly the runs it made.

plan      the jobs: their launcher lines, and why one cannot run
execute   running them one after another, with progress and each one's headline
emulate   the jobs on one emulated cluster per link rate (--emulate)
command   the subcommand: its flags and the order of the work
"""
