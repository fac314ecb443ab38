"""`commbench sweep` under a recovery policy (commbench.sweep.recovery_jobs): the launcher
line each policy's jobs get (dry runs, in-process), what `commbench run` would refuse
under that line found before any job, and through mpiexec a swept job killed by --fail
that its supervisor starts again, which records its recovery."""

import copy
import importlib.util
import os
import sys
from pathlib import Path

import pytest

from commbench.job.console import trained_line
from commbench.launch.mpirun_front.arguments import rewrite
from commbench.sweep.execute import headline
from launchers import only_result
from test_accuracy_analysis import fixture, write_run
from test_recovery import needs_dcp
from test_sweep import in_process, sweep
from test_training_to_accuracy import TINY_TASK

PYTHON = sys.executable
MPIEXEC = str(Path(PYTHON).parent / "mpiexec")
MPIRUN = str(Path(PYTHON).parent / "mpirun")
COMMBENCH = [PYTHON, "-m", "commbench"]
# 3 steps an epoch on 3 workers: evaluated at 3 and 6, checkpoints at 2 and 4.
TINY = [*TINY_TASK, "--max-epochs", "2", "--eval-every", "3", "--cpu-transport", "gloo"]
RESTART = ["--recovery", "restart", "--checkpoint-every", "2"]
GOSSIP = ["--dist-optimizer", "neighbor_allreduce", "--recovery", "gossip"]
needs_torchft = pytest.mark.skipif(importlib.util.find_spec("torchft") is None,
                                   reason="torchft is not installed here")


def planned(tmp_path, *args):
    """The dry run's job lines, each split, and its comment lines."""
    done = in_process(tmp_path, "--dry-run", *TINY, *args)
    lines = done.stdout.splitlines()
    return ([line.split() for line in lines if not line.startswith("#")],
            [line for line in lines if line.startswith("#")], done)


@pytest.mark.parametrize("fail, restarts", [("1@step4", "1"), ("1@step2,2@step4", "2"),
                                            ("none", "1")])
def test_a_restarting_mpiexec_job_runs_under_a_supervisor_restarting_it_per_failure(
        tmp_path, fail, restarts):
    needs_dcp()
    jobs, comments, done = planned(tmp_path, "--np", "3", "--oversubscribe", *RESTART,
                                   "--fail", fail)
    assert done.returncode == 0 and comments == [], done.stdout + done.stderr
    (job,) = jobs
    assert job[:9] == [*COMMBENCH, "supervise", "--restarts", restarts, "--", MPIEXEC, "-n"]
    assert job[job.index("--recovery") + 1] == "restart"


def test_a_restarting_torchrun_job_gets_max_restarts_on_torchruns_line(tmp_path):
    needs_dcp()
    jobs, comments, done = planned(tmp_path, "--launcher", "torchrun", "--np", "2",
                                   *RESTART, "--fail", "1@step4")
    assert done.returncode == 0 and comments == [], done.stdout + done.stderr
    (job,) = jobs
    assert job[:10] == [PYTHON, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", "--max-restarts", "1", "-m", "commbench"]


@pytest.mark.parametrize("fail", ["1@step4", "1@step4:cut"])
def test_a_restarting_job_on_an_emulated_cluster_runs_its_mpirun_under_a_supervisor(
        tmp_path, fail, monkeypatch):
    needs_dcp()
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # a cut needs root, as the cluster does
    jobs, _, done = planned(tmp_path, "--emulate", "2x1", *RESTART, "--fail", fail)
    assert done.returncode == 0, done.stdout + done.stderr
    (job,) = jobs
    assert job[:9] == [*COMMBENCH, "supervise", "--restarts", "1", "--", MPIRUN, "-H"]


def test_a_cut_off_an_emulated_cluster_is_skipped_with_runs_reason(tmp_path):
    needs_dcp()
    _, comments, done = planned(tmp_path, "--np", "2", *RESTART, "--fail", "1@step4:cut")
    assert done.returncode == 1
    assert comments[-1].startswith("# skipped: allreduce on 2: argument --fail: 1@step4:cut "
                                   "takes the rank's machine off the network")


def test_a_restart_that_could_not_resume_is_still_skipped_with_runs_reason(tmp_path):
    # the supervisor the sweep adds answers "nothing would start it again", not this
    _, comments, done = planned(tmp_path, "--np", "2", "--dist-optimizer", "local_sgd",
                                *RESTART, "--fail", "1@step4")
    assert done.returncode == 1
    assert comments[-1] == ("# skipped: local_sgd on 2: argument --recovery: local_sgd keeps "
                            "state of its own between steps, which a checkpoint of the model "
                            "and the optimizer would not resume; restart allreduce or none")


def test_a_gossip_job_keeps_its_survivors_running_under_mpiexec_and_mpirun(tmp_path):
    jobs, comments, done = planned(tmp_path, "--emulate", "3x1", "--link", "1gbit,shm",
                                   *GOSSIP, "--fail", "2@step4")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not [c for c in comments if "skipped" in c], comments  # neither job refused
    emulated, local = jobs
    assert emulated[:3] == [MPIRUN, "--enable-recovery", "-H"]
    assert local[:4] == [MPIEXEC, "--enable-recovery", "-n", "3"]
    assert [job.count("--enable-recovery") for job in jobs] == [1, 1]
    # where the launcher is commbench's mpirun front, it keeps the one given
    assert [rewrite(job[1:]) for job in jobs] == [job[1:] for job in jobs]


def test_a_gossip_job_whose_rank_rejoins_runs_under_commbench_gossip_here_or_on_its_cluster(
        tmp_path):
    jobs, comments, done = planned(tmp_path, "--np", "3", "--oversubscribe", *GOSSIP,
                                   "--fail", "2@step4+5s")
    assert done.returncode == 0 and comments == [], done.stdout + done.stderr
    (job,) = jobs
    assert job[:8] == [*COMMBENCH, "gossip", "--", MPIEXEC, "--enable-recovery", "-n"]
    jobs, comments, done = planned(tmp_path, "--emulate", "3x1", "--link", "1gbit,shm",
                                   *GOSSIP, "--fail", "mtbf=60s,seed=1,rejoin=5s")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not [c for c in comments if "skipped" in c], comments
    emulated, local = jobs
    assert emulated[:5] == [*COMMBENCH, "gossip", "--cluster"]
    assert emulated[6:10] == ["--", MPIRUN, "--enable-recovery", "-H"]
    assert local[:6] == [*COMMBENCH, "gossip", "--", MPIEXEC]


def test_a_gossip_job_under_torchrun_is_skipped_saying_it_needs_mpi(tmp_path):
    _, comments, done = planned(tmp_path, "--launcher", "torchrun", "--np", "2", *GOSSIP,
                                "--fail", "1@step4")
    assert done.returncode == 1
    assert comments[-1].startswith("# skipped: neighbor_allreduce on 2: argument --recovery: "
                                   "gossip needs an MPI launcher that keeps the others running")


@needs_torchft
@pytest.mark.parametrize("launcher", ["mpiexec", "torchrun"])
def test_a_torchft_job_is_started_by_commbench_torchft_in_place_of_the_launcher(
        tmp_path, launcher):
    jobs, comments, done = planned(tmp_path, "--launcher", launcher, "--np", "1,2",
                                   "--dist-optimizer", "diloco", "--average-every", "3",
                                   "--recovery", "torchft", "--fail", "1@step4")
    assert done.returncode == 1  # the count of 1 never runs
    (job,) = jobs
    assert job[:7] == [*COMMBENCH, "torchft", "-n", "2", "--"]
    assert MPIEXEC not in job and "torch.distributed.run" not in job
    assert job[7] == "--dist-optimizer=diloco" and job[-2] == "--results-dir"
    assert comments[-1] == ("# skipped: diloco on 1: torchft: -n 1 leaves no peer to recover "
                            "from; run 2 or more")


def test_a_torchft_job_on_emulated_machines_places_its_groups_on_the_clusters_machines(
        tmp_path):
    jobs, comments, done = planned(tmp_path, "--emulate", "2x1,2x2", "--recovery", "torchft",
                                   "--fail", "1@step4")
    assert done.returncode == 1, done.stdout + done.stderr  # the 2x2 layout is skipped
    (job,) = jobs
    at = job.index("--cluster")
    assert job[:at] == [*COMMBENCH, "torchft", "-n", "2"] and job[at + 2] == "--"
    assert f"# commbench cluster up --name {job[at + 1]} --machines 2 --slots 2 --link 1gbit" \
        in comments and MPIRUN not in job
    assert comments[-1] == (
        "# skipped: allreduce on 4 at 1gbit: argument --recovery: torchft places one replica "
        "group on each emulated machine (commbench torchft --cluster); give a layout of one "
        "worker per machine, e.g. --emulate 4x1")


def test_a_recovered_jobs_headline_says_its_policy_failures_and_goodput(tmp_path):
    path, doc = fixture("allreduce", 42)
    plain = headline(path)
    assert plain == trained_line(doc["summary"])  # a run without one: as it was
    doc = copy.deepcopy(doc)
    doc["recovery"] = {"policy": "gossip", "goodput": 12.75, "survivors": [0, 1, 3],
                       "costs": [{"event": "2@step8:kill"}]}
    assert headline(write_run(tmp_path, path.name, doc)) == (
        plain + "; --recovery gossip, 1 failure: goodput 12.8 img/sec of wall time")


@pytest.mark.mpi
@pytest.mark.timeout(420)
def test_a_swept_job_killed_by_fail_is_restarted_and_its_result_records_it(tmp_path):
    """A sweep of the tiny restarting run on 3 workers, rank 1 killed as step 4 begins:
    the supervisor the sweep put around mpiexec starts it again, it resumes from its
    checkpoint of step 2, and the job, the sweep and the report count it a success."""
    needs_dcp()
    done = sweep(tmp_path, "--np", "3", "--oversubscribe", *TINY, *RESTART, "--fail",
                 "1@step4", timeout=400)
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-2000:]
    assert "supervise --restarts 1 -- " in out
    assert "; --recovery restart, 1 failure: goodput " in out  # the job's headline
    doc = only_result(tmp_path / "results")
    assert doc["summary"]["steps"] == 6 and doc["failures"]["spec"] == "1@step4:kill"
    recovery = doc["recovery"]
    assert (recovery["policy"], recovery["restarts"]) == ("restart", 1)
    (cost,) = recovery["costs"]
    assert (cost["rank"], cost["failed_after_step"], cost["resumed_from_step"]) == (1, 3, 2)
    assert "N=3, seed 42: --recovery restart, 1 restart; goodput " in out  # the report's
