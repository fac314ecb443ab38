"""`commbench sweep`: real jobs through mpiexec, a report and a chart at the end (the
`mpi` tests); its dry runs and refusals, which start nothing, in-process."""

import json
import os
import re
import sys
from pathlib import Path

import pytest

from cli_helpers import commbench
from launchers import PYTHON, TINY_RUN, run

TESTS = str(Path(__file__).resolve().parent)


def sweep(tmp_path, *args, timeout=240):
    env = {"PYTHONPATH": os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")])}
    return run([PYTHON, "-m", "commbench", "sweep", "--results-dir", str(tmp_path / "results"),
                "--plots-dir", str(tmp_path / "charts"), *args], timeout, env=env, cwd=tmp_path)


def in_process(tmp_path, *args):
    """The same command line, in this process: for dry runs and refusals (tests/ is on
    this process's path already, where sweep_plugins is)."""
    return commbench("sweep", "--results-dir", tmp_path / "results", "--plots-dir",
                     tmp_path / "charts", *args, cwd=tmp_path)


@pytest.mark.mpi
def test_sweep_runs_every_combination_reports_failures_and_goes_on(tmp_path):
    done = sweep(tmp_path, "--np", "1,2",
                 "--dist-optimizer", "allreduce,sweep_plugins:Crashes,none", *TINY_RUN)
    out = done.stdout
    # The failing strategy fails on both counts; the others still ran.
    assert done.returncode == 1, out[-3000:]
    assert "[6/6]" in out and out.count("FAILED after") == 2
    assert "| commbench: error: rank 0: RuntimeError: this strategy fails on purpose" in out
    assert "2 job(s) failed: sweep_plugins:Crashes on 1, sweep_plugins:Crashes on 2" in out
    assert len(re.findall(r"done in [\d.]+ s: Total img/sec on \d worker", out)) == 4
    assert "left" in out and "elapsed" in out

    files = sorted((tmp_path / "results").glob("*.json"))
    assert len(files) == 4
    made = {(d["strategy"]["name"], d["summary"]["workers"])
            for d in (json.loads(f.read_text()) for f in files)}
    assert made == {("allreduce", 1), ("allreduce", 2), ("none", 1), ("none", 2)}
    assert "E(N)" in out  # the report of what it ran
    charts = sorted((tmp_path / "charts").glob("*.png"))  # scaling, and where time went
    assert [c.name.split("-")[0] for c in charts] == ["scaling", "split"]
    assert all(c.stat().st_size > 10_000 for c in charts)


def test_dry_run_prints_the_exact_commands_and_skips_impossible_ones(tmp_path):
    done = in_process(tmp_path, "--dry-run", "--np", "1,2,4", "--oversubscribe",
                 "--dist-optimizer", "allreduce,no_such_strategy", "--batch-size", "8")
    assert done.returncode == 1, done.stderr  # it would not run all it was asked for
    lines = done.stdout.strip().splitlines()
    results = str(tmp_path / "results")
    assert lines[0].split() == [
        str(Path(sys.executable).parent / "mpiexec"), "-n", "1", sys.executable, "-m",
        "commbench", "--dist-optimizer=allreduce", "--batch-size", "8", "--results-dir", results]
    over = "--oversubscribe" if (os.cpu_count() or 1) < 4 else None
    assert ("--oversubscribe" in lines[2].split()) == bool(over)
    assert lines[3] == "# never ran: strategy no_such_strategy"
    assert lines[4] == ("# skipped: no_such_strategy on 1: argument --dist-optimizer: unknown "
                        "strategy 'no_such_strategy'; available: " + lines[4].split(
                            "available: ")[1])
    assert len(lines) == 7 and not (tmp_path / "results").exists()


@pytest.mark.mpi
@pytest.mark.timeout(240)
def test_a_sweep_that_skips_runs_the_rest_then_exits_1_ending_with_its_chart(tmp_path):
    done = sweep(tmp_path, "--np", "1", "--dist-optimizer", "none,bogus", *TINY_RUN,
                 timeout=200)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "done in" in done.stdout and len(list((tmp_path / "results").glob("*.json"))) == 1
    lines = done.stdout.strip().splitlines()
    skipped = [i for i, line in enumerate(lines) if line.startswith("skipped: ")]
    assert len(skipped) == 1 and lines[skipped[0]].startswith(
        "skipped: bogus on 1: argument --dist-optimizer: unknown strategy 'bogus'")
    assert skipped[0] < lines.index("$ commbench report ...")  # listed once, before it
    assert Path(lines[-1]).parent == tmp_path / "charts" and Path(lines[-1]).is_file()


def test_topology_flags_go_only_to_the_strategies_that_have_one(tmp_path):
    done = in_process(tmp_path, "--dry-run", "--np", "2", "--dist-optimizer",
                 "allreduce,neighbor_allreduce", "--topology", "ring", "--atc-style")
    assert done.returncode == 0, done.stdout + done.stderr
    allreduce, neighbor = done.stdout.splitlines()
    assert "--topology" not in allreduce and "--atc-style" not in allreduce
    assert "--topology ring --atc-style" in neighbor


def test_a_timeline_passed_through_is_each_jobs_own(tmp_path):
    done = in_process(tmp_path, "--dry-run", "--np", "1,2", "--dist-optimizer", "allreduce,none",
                 "--repeat", "2", "--timeline", str(tmp_path / "t.json"))
    assert done.returncode == 0, done.stderr
    paths = [line.split("--timeline ")[1].split()[0] for line in done.stdout.splitlines()]
    assert paths == [str(tmp_path / f"t-{name}.json") for name in (
        "allreduce-n1", "allreduce-n2", "none-n1", "none-n2",
        "allreduce-n1-r2", "allreduce-n2-r2", "none-n1-r2", "none-n2-r2")]


def test_a_strategy_that_needs_an_mpi_launcher_runs_under_mpiexec_not_torchrun(tmp_path):
    # the engines (horovod, bluefog.*) check the launcher the ranks will detect
    done = in_process(tmp_path, "--dry-run", "--np", "2", "--dist-optimizer",
                      "sweep_plugins:NeedsMpi")
    assert done.returncode == 0 and "# skipped" not in done.stdout, done.stdout
    done = in_process(tmp_path, "--dry-run", "--launcher", "torchrun", "--np", "2",
                 "--dist-optimizer", "sweep_plugins:NeedsMpi")
    assert "# skipped: sweep_plugins:NeedsMpi on 2: needs-mpi cannot run under torchrun" \
        in done.stdout, done.stdout


def test_torchrun_dry_run_and_bad_run_flags_fail_before_any_job(tmp_path):
    done = in_process(tmp_path, "--dry-run", "--launcher", "torchrun", "--np", "2")
    # torchrun through the sweep's own Python, not whichever torchrun PATH finds
    assert (f"{sys.executable} -m torch.distributed.run --standalone --nproc-per-node 2 "
            "-m commbench") in done.stdout
    done = in_process(tmp_path, "--np", "1", "--batch-size", "0")
    assert done.returncode == 2 and "--batch-size: must be a positive integer" in done.stderr


@pytest.mark.mpi
def test_two_sweeps_into_one_directory_lose_and_overwrite_nothing(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    args = ["--np", "1", "--dist-optimizer", "allreduce,none", *TINY_RUN]
    with ThreadPoolExecutor(2) as pool:
        both = list(pool.map(lambda _: sweep(tmp_path, *args), range(2)))
    assert [d.returncode for d in both] == [0, 0], both[0].stdout[-2000:]
    reported = {line.split("result: ")[-1] for d in both for line in d.stdout.splitlines()
                if line.startswith("    result: ")}
    files = sorted((tmp_path / "results").glob("*.json"))
    assert len(files) == 4
    docs = [json.loads(f.read_text()) for f in files]  # every file complete
    assert sorted(d["strategy"]["name"] for d in docs) == ["allreduce", "allreduce",
                                                           "none", "none"]
    assert not list((tmp_path / "results").glob(".partial-*"))
    assert reported == {str(f) for f in files}


def job_processes(marker: str):
    """Pids of processes whose command line holds `marker` (the test's results dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            line = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if entry.name.isdigit() and marker in line and "--dist-optimizer=" in line:
            found.append(int(entry.name))
    return found


@pytest.mark.mpi
@pytest.mark.timeout(180)
@pytest.mark.parametrize("signal_name", ["SIGINT", "SIGTERM"])
def test_a_stopped_sweep_ends_its_running_job(tmp_path, signal_name):
    """Ctrl-C or SIGTERM (a batch system's limit) on a sweep ends the job it is running,
    which runs in a session of its own, instead of leaving it behind."""
    import signal
    import subprocess
    import time

    results = str(tmp_path / "results")
    proc = subprocess.Popen([PYTHON, "-m", "commbench", "sweep", "--np", "2", "--dist-optimizer",
                             "allreduce", "--model", "resnet18", "--image-size", "32",
                             "--num-iters", "1000", "--results-dir", results],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 90
        while len(job_processes(results)) < 3:  # the launcher and both ranks
            assert time.monotonic() < deadline, "the sweep's job never started"
            time.sleep(0.5)
        proc.send_signal(getattr(signal, signal_name))
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10
        while job_processes(results) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job_processes(results) == [], "the job outlived its sweep"
        assert proc.returncode != 0
    finally:
        proc.kill()
        for pid in job_processes(results):
            os.kill(pid, signal.SIGKILL)


def test_stragglers_and_shared_memory_are_axes_of_one_emulated_study(tmp_path):
    done = in_process(tmp_path, "--dry-run", "--emulate", "2x1", "--link", "200mbit,shm",
                      "--slow-ranks", "none", "--slow-ranks", "1:2", "--slow-ranks", "3:2",
                      "--link-of", "m1=100mbit", "--dist-optimizer", "allreduce")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    up = next(line for line in lines if "cluster up" in line)
    assert up.endswith("--link 200mbit --link-of m1=100mbit")
    jobs = [line for line in lines if not line.startswith("#")]
    on_cluster = [j for j in jobs if "/mpirun -H" in j]
    on_shm = [j for j in jobs if "/mpiexec -n 2" in j]
    assert len(on_cluster) == len(on_shm) == 2  # none and 1:2; rank 3 is not in 2 ranks
    for found in (on_cluster, on_shm):
        assert ["--slow-ranks" in j for j in found] == [False, True]
        assert found[1].split("--slow-ranks ")[1].split()[0] == "1:2"
    shm_at = lines.index("# on this machine's shared memory (no cluster)")
    assert all(lines.index(j) > shm_at for j in on_shm)
    skipped = [line for line in lines if line.startswith("# skipped")]
    assert len(skipped) == 2 and all("rank 3 does not exist" in s for s in skipped)


@pytest.mark.parametrize("args, says", [
    (["--np", "2", "--link-of", "m1=100mbit"], "--link-of: sets the links of emulated "
     "machines; only with --emulate"),
    (["--np", "2", "--link", "100mbit"], "--link: sets the links of emulated machines; only "
     "with --emulate"),
    (["--emulate", "2x1", "--link-of", "m2=100mbit"], "m2 is not a machine of this cluster"),
    (["--emulate", "2x1", "--link", "shm,fast"], "argument --link: must be link rates"),
    (["--np", "2", "--slow-ranks", "1:0.5"], "argument --slow-ranks: must be none or"),
    (["--emulate", "2x1", "--launcher", "torchrun"], "argument --launcher: an emulated sweep "
     "starts every job under Open MPI, never torchrun"),
    (["--emulate", "2x1", "--np", "4"], "argument --np: an emulated sweep runs as many "
     "workers as its layouts hold"),
])
def test_bad_axes_are_one_line_before_anything_runs(tmp_path, args, says):
    done = in_process(tmp_path, "--dry-run", *args)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, \
        done.stderr
    assert not (tmp_path / "results").exists()


def test_quick_jobs_trained_to_accuracy_take_its_workload_not_its_timing(tmp_path):
    done = in_process(tmp_path, "--dry-run", "--quick", "--np", "1", "--data", "learnable",
                      "--max-epochs", "1")
    assert done.returncode == 0, done.stderr
    (job,) = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    assert "--model squeezenet1_1 --image-size 32 --batch-size 16" in job
    assert "--num-iters" not in job and "--reference-iters" not in job
    timed = in_process(tmp_path, "--dry-run", "--quick", "--np", "1")
    assert "--num-iters 60" in timed.stdout


def test_a_layout_of_machines_on_shared_memory_keeps_its_machines(tmp_path):
    done = in_process(tmp_path, "--dry-run", "--emulate", "2x2,4x1", "--link", "shm",
                      "--dist-optimizer", "hierarchical_neighbor_allreduce,allreduce")
    assert done.returncode == 0, done.stdout + done.stderr
    jobs = [line for line in done.stdout.splitlines() if not line.startswith("#")]
    hierarchical = [j for j in jobs if "=hierarchical" in j]
    assert len(hierarchical) == 1 and "--machine-size 2" in hierarchical[0]  # 4x1: skipped
    # hierarchical's 2x2 alone: allreduce groups no ranks into machines, 4x1 has none
    assert sum("--machine-size" in j for j in jobs) == 1
