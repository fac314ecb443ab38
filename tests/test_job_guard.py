"""The guard of conftest.py: a test not marked `mpi` cannot start a job, and a test
marked neither `job` nor `mpi` cannot start a Python process."""

import subprocess
import sys

import pytest
from conftest import starts_a_job, starts_python


def test_a_test_not_marked_mpi_cannot_start_a_launcher():
    with pytest.raises(AssertionError, match="not marked `mpi` started a job"):
        subprocess.run(["mpiexec", "-n", "2", "true"])


@pytest.mark.job
def test_a_job_test_cannot_start_a_launcher_either():
    with pytest.raises(AssertionError, match="not marked `mpi` started a job"):
        subprocess.run(["mpiexec", "-n", "2", "true"])


@pytest.mark.parametrize("argv", [
    [sys.executable, "-c", "pass"],
    [sys.executable, "-m", "commbench", "list"],
    ["python3", "-m", "pip", "--version"],
    "python -c pass",
])
def test_a_fast_test_cannot_start_python(argv):
    with pytest.raises(AssertionError) as refused:
        subprocess.run(argv, shell=isinstance(argv, str))
    assert str(refused.value) == ("a test marked neither `job` nor `mpi` started a Python "
                                  f"process: {argv}")


@pytest.mark.job
def test_a_job_test_can_start_python():
    done = subprocess.run([sys.executable, "-c", "print('ran')"], capture_output=True,
                          text=True, timeout=60)
    assert done.stdout == "ran\n"


def test_a_fast_test_can_run_cheap_tools():
    assert subprocess.run(["git", "--version"], capture_output=True).returncode == 0
    assert subprocess.run(["bash", "-n", "/dev/null"]).returncode == 0


@pytest.mark.parametrize("argv, starts", [
    (["/venv/bin/mpirun", "-np", "2", "python"], True),
    ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"], True),
    (["horovodrun", "-np", "2"], True),
    ([sys.executable, "-m", "commbench", "sweep", "--np", "1,2"], True),
    ([sys.executable, "-m", "commbench", "sweep", "--dry-run"], False),
    ([sys.executable, "-m", "commbench", "report", "results"], False),
    ([sys.executable, "-m", "commbench", "--model", "resnet18"], False),
    ("mpiexec -n 2 true", True),
])
def test_what_counts_as_starting_a_job(argv, starts):
    assert starts_a_job(argv) is starts


@pytest.mark.parametrize("argv, starts", [
    ([sys.executable, "-m", "commbench", "report", "results"], True),
    (["/usr/bin/python3.11", "-c", "pass"], True),
    (["/venv/bin/commbench", "list"], True),
    (["pip", "install", "x"], True),
    (["env", "X=1", sys.executable, "-m", "commbench", "list"], True),
    ("python -c 'import sys'", True),
    (["git", "rev-parse", "HEAD"], False),
    (["bash", "-n", "script.sh"], False),
    (["make", "-n", "env"], False),
    (["ruff", "check", "tests"], False),
    (["setpriv", "--inh-caps", "-net_admin", "ip", "link"], False),
])
def test_what_counts_as_starting_python(argv, starts):
    assert starts_python(argv) is starts
