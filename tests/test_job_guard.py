"""The guard of conftest.py: a test not marked `mpi` cannot start a job."""

import subprocess
import sys

import pytest
from conftest import starts_a_job


def test_a_test_not_marked_mpi_cannot_start_a_launcher():
    with pytest.raises(AssertionError, match="not marked `mpi` started a job"):
        subprocess.run(["mpiexec", "-n", "2", "true"])


@pytest.mark.parametrize("argv, starts", [
    (["/venv/bin/mpirun", "-np", "2", "python"], True),
    ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"], True),
    (["horovodrun", "-np", "2"], True),
    ([sys.executable, "-m", "commbench", "sweep", "--np", "1,2"], True),
    ([sys.executable, "-m", "commbench", "sweep", "--dry-run"], False),
    ([sys.executable, "-m", "commbench", "report", "results"], False),
    ([sys.executable, "-m", "commbench", "--model", "resnet18"], False),
])
def test_what_counts_as_starting_a_job(argv, starts):
    assert starts_a_job(argv) is starts
