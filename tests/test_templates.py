"""The job templates under launch/templates/ parse, and what they start is a command
commbench accepts: shell scripts pass `bash -n`, manifests load as YAML with as many
ranks as slots, the hostfile's lines are Open MPI's, the image builds with a make
target that exists. Every template file is checked: a new one without a check fails."""

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from commbench.cli import build_parser
from commbench.registry import discover

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "launch" / "templates"
CHECKED = {"hostfile", "slurm.sbatch", "torchrun.sh", "Dockerfile", "mpijob.yaml",
           "mpijob-horovod.yaml"}


def test_every_template_has_a_check():
    assert {p.name for p in TEMPLATES.iterdir()} == CHECKED


def commbench_flags(words):
    """The run flags after `python -m commbench` (or `-m commbench`) in words."""
    start = next(i for i in range(len(words) - 1) if words[i:i + 2] == ["-m", "commbench"])
    return words[start + 2:]


def check_run_flags(flags):
    """The flags are run's, and the strategy is one this installation knows."""
    args = build_parser().parse_args(["run", *flags])
    assert args.dist_optimizer in discover(), args.dist_optimizer


# Values for the shell variables the templates' commbench lines use.
SHELL_VALUES = {"$strategy": "allreduce", "$SLURM_JOB_ID": "1"}


@pytest.mark.parametrize("name", ["slurm.sbatch", "torchrun.sh"])
def test_shell_templates_parse_and_start_commbench_with_its_flags(name):
    path = TEMPLATES / name
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = path.read_text().replace("\\\n", " ")
    (line,) = [line for line in text.splitlines()
               if "-m commbench" in line and not line.lstrip().startswith("#")]
    for variable, value in SHELL_VALUES.items():
        line = line.replace(variable, value)
    check_run_flags([word for word in commbench_flags(shlex.split(line)) if word != "$@"])


@pytest.mark.parametrize("name, launcher", [("mpijob.yaml", "mpirun"),
                                            ("mpijob-horovod.yaml", "horovodrun")])
def test_mpijob_manifests_load_and_start_as_many_ranks_as_slots(name, launcher):
    (doc,) = yaml.safe_load_all((TEMPLATES / name).read_text())
    assert doc["apiVersion"] == "kubeflow.org/v2beta1" and doc["kind"] == "MPIJob"
    spec = doc["spec"]
    launcher_spec, worker = spec["mpiReplicaSpecs"]["Launcher"], spec["mpiReplicaSpecs"]["Worker"]
    assert launcher_spec["replicas"] == 1
    (container,) = launcher_spec["template"]["spec"]["containers"]
    command = [str(word) for word in container["command"]]
    assert command[0] == launcher
    ranks = int(command[command.index("-np") + 1])
    assert ranks == worker["replicas"] * spec["slotsPerWorker"]
    (worker_container,) = worker["template"]["spec"]["containers"]
    gpus = worker_container["resources"]["limits"]["nvidia.com/gpu"]
    assert gpus == spec["slotsPerWorker"]  # one rank per GPU
    assert worker_container["image"] == container["image"]
    check_run_flags(commbench_flags(command))


def test_the_hostfile_is_open_mpis_and_its_usage_lines_start_commbench():
    lines = (TEMPLATES / "hostfile").read_text().splitlines()
    hosts = [line.split() for line in lines if line and not line.startswith("#")]
    assert hosts and all(len(h) == 2 and h[1].startswith("slots=") and int(h[1][6:]) > 0
                         for h in hosts)
    usage = [line.lstrip("# ") for line in lines if "-m commbench" in line]
    assert len(usage) == 3
    for line in usage:
        check_run_flags(commbench_flags(shlex.split(line)))


def test_the_image_builds_with_make_targets_that_exist():
    instructions = [line.split()[0] for line in (TEMPLATES / "Dockerfile").read_text()
                    .replace("\\\n", " ").splitlines() if line and not line.startswith("#")]
    assert instructions[0] == "ARG" and "FROM" in instructions
    assert set(instructions) <= {"ARG", "FROM", "RUN", "COPY", "WORKDIR", "ENV"}
    # what the image's RUN line asks of make, dry-run: the targets exist, TORCH picks the index
    done = subprocess.run(["make", "-n", "-C", str(ROOT), "env", "engines", "TORCH=cu126",
                           "VENV=/nonexistent-venv"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "--index-url https://download.pytorch.org/whl/cu126 torch==" in done.stdout


def test_a_new_environment_is_refused_in_one_line_where_the_disk_lacks_room(tmp_path):
    """pip stopped halfway by a full disk leaves a broken .venv behind: `make` checks
    first, and says how much room it needs."""
    done = subprocess.run(["make", "-s", "-C", str(ROOT), "env", f"VENV={tmp_path}/venv",
                           "ENV_GIB=1000000"], capture_output=True, text=True)
    assert done.returncode != 0 and not (tmp_path / "venv").exists()
    assert re.search(rf"^commbench: error: setting up {tmp_path}/venv needs about 1000000 "
                     r"GiB free on this disk; \d+ GiB are free$", done.stderr, re.M)
