"""Third-party plugins: a real package (tests/plugin_example/) pip-installed into a
temporary target directory on PYTHONPATH is found through the entry-point group
`commbench.optimizers`, listed with its source, and runs a real job; the same class
also loads by `module:Class` path without being installed. Its microbench op is found
through `commbench.microbench_ops` and runs. It communicates uncounted: its result and
`report` say so."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from launchers import PYTHON, TINY_RUN, mpiexec, only_result, run

pytestmark = pytest.mark.job  # pip installs the example; `python -m commbench` finds it
EXAMPLE = Path(__file__).resolve().parent / "plugin_example"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """PYTHONPATH under which the example package is pip-installed (with its
    dist-info and entry points), built from a copy so the source tree stays clean."""
    work = tmp_path_factory.mktemp("plugin")
    source, target = work / "src", work / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("*.egg-info", "build"))
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(source)],
                   check=True, timeout=240)
    assert list(target.glob("commbench_plugin_example-*.dist-info"))
    return pythonpath(target)


def pythonpath(first):
    # No empty entry: that would put the working directory (and any stale
    # commbench.egg-info in it) on sys.path ahead of the installed commbench.
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join([str(first), *rest])}


def commbench(*args, env=None, timeout=120):
    # Not from the source tree: `python -m` puts the working directory first on sys.path,
    # where a commbench.egg-info left by a build would shadow the installed metadata.
    return run([PYTHON, "-m", "commbench", *args], timeout, env=env,
               cwd=Path(tempfile.gettempdir()))


def listed(stdout):
    """name -> the first line of its row in `commbench list`."""
    rows = {}
    for line in stdout.splitlines():
        parts = line.split()
        if line.startswith("  ") and parts and parts[0] not in rows:
            rows[parts[0]] = line
    return rows


def test_list_shows_an_installed_plugin_its_source_and_why_not(installed):
    done = commbench("list", env=installed)
    assert done.returncode == 0, done.stderr
    rows = listed(done.stdout)
    assert "usable" in rows["example_average"] and "NOT USABLE" not in rows["example_average"]
    assert "[commbench-plugin-example]" in rows["example_average"]
    assert "NOT USABLE: needs commbench_example_no_such_module" in rows["example_unusable"]
    assert "[commbench]" in rows["allreduce"]
    # An engine that needs an optional package is listed, usable or with how to get it.
    horovod = rows["horovod"]
    if os.environ.get("COMMBENCH_REQUIRE_ENGINES") == "1":
        assert "NOT USABLE" not in horovod, horovod
    else:
        assert "NOT USABLE" not in horovod or "scripts/install_horovod.sh" in horovod, horovod
    # A plugin's own flags are listed under it.
    below = done.stdout.split(rows["example_average"], 1)[1].splitlines()[1:3]
    assert any("its flags: --period" in line for line in below), below


def test_without_the_package_the_plugin_is_not_there():
    done = commbench("list")
    assert done.returncode == 0 and "example_average" not in done.stdout
    done = commbench("--period", "2")
    assert done.returncode == 2 and "unrecognized arguments: --period" in done.stderr


def test_a_bad_value_of_a_plugin_flag_is_one_line(installed):
    done = commbench("--dist-optimizer", "example_average", "--period", "0", env=installed)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "commbench run: error: argument --period: must be a positive integer, got '0' "
        "(see --help)"]


def test_installed_plugin_runs_a_real_job_with_its_own_flag(installed, tmp_path):
    done = commbench("--dist-optimizer", "example_average", "--period", "2",
                     "--results-dir", str(tmp_path), *TINY_RUN, env=installed)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    assert doc["config"]["period"] == 2
    assert doc["strategy"] == {"name": "example_average", "decentralized": False,
                               "plugin_package": "commbench-plugin-example"}


@pytest.mark.mpi
def test_installed_plugin_runs_under_mpiexec(installed, tmp_path):
    done = mpiexec(2, ["-m", "commbench", "--dist-optimizer=example_average",
                       "--results-dir", str(tmp_path), *TINY_RUN], timeout=240, env=installed,
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    assert doc["summary"]["workers"] == 2
    # The plugin averages the parameters after every step: all ranks end equal.
    assert doc["summary"]["parameters_identical"] is True
    # It calls torch.distributed itself, so no byte was counted: flagged, not a silent 0.
    assert doc["summary"]["wire"]["bytes_per_step"] == 0
    assert doc["summary"]["wire_unrecorded"] is True
    assert "On the wire: NOT RECORDED" in done.stdout
    report = commbench("report", str(tmp_path))
    assert report.returncode == 0, report.stderr
    flagged = [line for line in report.stdout.splitlines() if "No bytes on the wire" in line]
    assert len(flagged) == 1 and "example_average, N=2" in flagged[0], report.stdout


def test_an_installed_plugins_microbench_op_is_listed_and_runs(installed, tmp_path):
    done = commbench("microbench", "--help", env=installed)
    assert done.returncode == 0 and "example_average" in done.stdout, done.stderr
    done = commbench("microbench", "--op", "example_average", "-b", "64", "-e", "64", "-n", "2",
                     "-w", "1", "--results-dir", str(tmp_path), env=installed)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    assert doc["summary"]["ops"] == ["example_average"] and doc["summary"]["wrong"] == 0
    assert {row["op"] for row in doc["rows"]} == {"example_average"}


def test_dotted_path_runs_the_plugin_without_installing_it(tmp_path):
    env = pythonpath(EXAMPLE)
    done = commbench("--dist-optimizer", "commbench_plugin_example:ParameterAverage",
                     "--results-dir", str(tmp_path), *TINY_RUN, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert only_result(tmp_path)["strategy"]["name"] == "example_average"
