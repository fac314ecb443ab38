"""Launcher detection from the variables each launcher really exports."""

import pytest

from commbench.errors import UsageError
from commbench.launch.detect import LaunchInfo, detect_launch

CASES = {
    "single": ({}, LaunchInfo("single", 0, 1, 0, 1, 0)),
    "openmpi": ({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                 "OMPI_COMM_WORLD_NODE_RANK": "1"},
                LaunchInfo("openmpi", 5, 8, 1, 4, 1)),
    "mpich": ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
               "MPI_LOCALNRANKS": "2"},
              LaunchInfo("mpich", 3, 4, 1, 2, None)),
    "mpich-without-hydra-locals": ({"PMI_RANK": "0", "PMI_SIZE": "2"},
                                   LaunchInfo("mpich", 0, 2, None, None, None)),
    "cray-mpich": ({"PMI_RANK": "5", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "1",
                    "PMI_LOCAL_SIZE": "4"},
                   LaunchInfo("mpich", 5, 8, 1, 4, None)),
    "srun-mpi-pmi2": ({"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_PROCID": "3",
                       "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"},
                      LaunchInfo("mpich", 3, 4, 1, None, None)),
    "horovodrun": ({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0",
                    "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1",
                    "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"},
                   LaunchInfo("horovodrun", 2, 4, 0, 2, 1)),
    "torchrun": ({"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                  "GROUP_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"},
                 LaunchInfo("torchrun", 3, 4, 1, 2, 1)),
    "slurm": ({"SLURM_PROCID": "5", "SLURM_NTASKS": "7", "SLURM_LOCALID": "1",
               "SLURM_NODEID": "2", "SLURM_TASKS_PER_NODE": "2(x3),1"},
              LaunchInfo("slurm", 5, 7, 1, 2, 2)),
    "slurm-last-node": ({"SLURM_PROCID": "6", "SLURM_NTASKS": "7", "SLURM_LOCALID": "0",
                         "SLURM_NODEID": "3", "SLURM_TASKS_PER_NODE": "2(x3),1"},
                        LaunchInfo("slurm", 6, 7, 0, 1, 3)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_launcher_is_read_from_its_variables(case):
    environ, expected = CASES[case]
    assert detect_launch(environ) == expected


def test_horovodrun_with_mpi_is_horovod_and_knows_mpi_started_it():
    environ = {**CASES["openmpi"][0], "HOROVOD_RANK": "5", "HOROVOD_SIZE": "8"}
    assert detect_launch(environ).launcher == "horovodrun"


def test_mpirun_inside_a_slurm_allocation_is_mpi_not_slurm():
    environ = {**CASES["slurm"][0], **CASES["openmpi"][0]}
    info = detect_launch(environ)
    assert (info.launcher, info.rank, info.world_size) == ("openmpi", 5, 8)
    assert info.mpi


def test_torchrun_inside_slurm_is_torchrun():
    environ = {**CASES["slurm"][0], **CASES["torchrun"][0]}
    assert detect_launch(environ).launcher == "torchrun"


@pytest.mark.parametrize("environ, message", [
    ({"RANK": "4", "WORLD_SIZE": "4"}, "rank 4 of world size 4"),
    ({"PMI_RANK": "x", "PMI_SIZE": "2"}, "PMI_RANK='x' is not an integer"),
])
def test_impossible_values_are_one_line_errors(environ, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        detect_launch(environ)
