"""Exit codes that tell the truth: a sweep that skipped a job it was asked for exits 1
and lists what it skipped before its report; a value or a combination of flags that would be
ignored, or fail later, is refused at once in one line with exit 2. In-process: no job
is started (the one real sweep is in tests/test_sweep.py)."""

from pathlib import Path

import pytest

from cli_helpers import commbench
from commbench.cli import build_parser, main
from commbench.config.run_config import RunConfig, config_from_args
from commbench.errors import UsageError
from commbench.launch.detect import LaunchInfo
from commbench.sweep import command as sweep_command
from commbench.sweep.plan import plan
from commbench.sweep.run_flags import without_options

NCCL = Path(__file__).parent / "data" / "nccl-tests"
BETWEEN_MACHINES = str(NCCL / "all_reduce_perf-h100-2x8.txt")
INSIDE_A_MACHINE = str(NCCL / "sendrecv_perf-a100-1x8.txt")
TWO_RANKS = LaunchInfo("openmpi", 0, 2, 0, 2, 0)
FOUR_RANKS = LaunchInfo("openmpi", 0, 4, 0, 4, 0)


def exit_of(argv, capsys):
    """(exit code, stdout, stderr) of the command run in this process."""
    with pytest.raises(SystemExit) as ended:
        main(argv)
    out, err = capsys.readouterr()
    return ended.value.code, out, err


def one_line_error(argv, capsys) -> str:
    code, out, err = exit_of(argv, capsys)
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    return err


# --- sweep: a skip is a failure, said once before the report ---------------------------

def test_a_dry_run_that_would_skip_exits_1_and_ends_with_the_skipped(tmp_path, capsys):
    code, out, _ = exit_of(["sweep", "--dry-run", "--np", "1,2", "--dist-optimizer",
                            "none,bogus", "--results-dir", str(tmp_path)], capsys)
    lines = out.splitlines()
    assert code == 1
    assert [line.split()[-3] for line in lines[:2]] == ["--dist-optimizer=none"] * 2
    assert lines[2] == "# never ran: strategy bogus"
    assert lines[3:] == [
        f"# skipped: bogus on {n}: argument --dist-optimizer: unknown strategy 'bogus'; "
        "available: " + lines[3].split("available: ")[1] for n in (1, 2)]


def test_a_dry_run_with_nothing_skipped_still_exits_0(tmp_path, capsys):
    code, out, _ = exit_of(["sweep", "--dry-run", "--np", "1", "--dist-optimizer", "none",
                            "--results-dir", str(tmp_path)], capsys)
    assert code == 0 and "skipped" not in out


def test_a_hole_in_the_grid_is_listed_last_but_fails_nothing(tmp_path, capsys):
    """hierarchical cannot run on one worker; it runs on 4, and 1 worker runs allreduce:
    every strategy and every count asked for was measured."""
    code, out, _ = exit_of(["sweep", "--dry-run", "--np", "1,4", "--machine-size", "2",
                            "--oversubscribe",
                            "--dist-optimizer", "allreduce,hierarchical_neighbor_allreduce",
                            "--results-dir", str(tmp_path)], capsys)
    assert code == 0
    assert out.splitlines()[-1].startswith(
        "# skipped: hierarchical_neighbor_allreduce on 1: argument --machine-size: ")


def test_a_worker_count_nothing_runs_at_exits_1(tmp_path, capsys):
    code, out, _ = exit_of(["sweep", "--dry-run", "--np", "1,4", "--machine-size", "2",
                            "--oversubscribe",
                            "--dist-optimizer", "hierarchical_neighbor_allreduce",
                            "--results-dir", str(tmp_path)], capsys)
    assert code == 1 and "# never ran: 1 worker(s)\n# skipped: " in out


def _ran(tmp_path):
    """A run_jobs stand-in: every runnable job ends well with a result file."""
    def run_jobs(jobs, timeout, env):
        for job in jobs:
            if not job.skip_reason:
                job.ok, job.result = True, tmp_path / f"{job.strategy}-{job.workers}.json"
    return run_jobs


def test_a_sweep_that_skipped_exits_1_after_running_the_rest(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sweep_command, "run_jobs", _ran(tmp_path))
    reported = []
    monkeypatch.setattr(sweep_command, "_commbench",
                        lambda *a: (reported.append(a[0]), print(f"$ commbench {a[0]}")))
    code, out, _ = exit_of(["sweep", "--np", "1,2", "--dist-optimizer", "none,bogus",
                            "--results-dir", str(tmp_path)], capsys)
    assert code == 1
    assert reported == ["report", "plot"]  # what could run ran, and was reported
    lines = out.splitlines()
    assert lines[-5] == "never ran: strategy bogus"
    skipped = lines[-4:-2]
    assert [line.split(": argument")[0] for line in skipped] == ["skipped: bogus on 1",
                                                                  "skipped: bogus on 2"]
    assert all("unknown strategy 'bogus'" in line for line in skipped)
    # once, and before the report: the chart's path stays the last line
    assert lines[-2:] == ["$ commbench report", "$ commbench plot"]
    assert out.count("skipped: bogus on 1") == 1


def test_a_sweep_with_nothing_skipped_exits_0(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sweep_command, "run_jobs", _ran(tmp_path))
    monkeypatch.setattr(sweep_command, "_commbench", lambda *a: None)
    code, out, _ = exit_of(["sweep", "--np", "1", "--dist-optimizer", "none",
                            "--results-dir", str(tmp_path)], capsys)
    assert code == 0 and "skipped" not in out


# --- sweep: no more workers than cores unless asked ------------------------------------

CROWDED = ("# left out 4 worker(s): more than this machine's 2 physical core(s), they would "
           "measure CPU sharing (--oversubscribe runs them)")


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr("commbench.result.environment.physical_cores", lambda: 2)


def test_a_sweep_leaves_out_the_worker_counts_above_the_cores_saying_so_once(
        tmp_path, capsys, two_cores):
    code, out, _ = exit_of(["sweep", "--dry-run", "--np", "1,2,4", "--dist-optimizer",
                            "allreduce,none", "--results-dir", str(tmp_path)], capsys)
    lines = out.splitlines()
    assert code == 0  # what fits was asked for too: no mistake
    assert [line.split()[2] for line in lines[:4]] == ["1", "2", "1", "2"]  # mpiexec -n N
    assert lines[4:] == [CROWDED]


def test_oversubscribe_runs_them_all(tmp_path, capsys, two_cores):
    code, out, _ = exit_of(["sweep", "--dry-run", "--np", "1,2,4", "--dist-optimizer",
                            "none", "--oversubscribe", "--results-dir", str(tmp_path)], capsys)
    assert code == 0 and "left out" not in out
    assert [line.split()[2] for line in out.splitlines()] == ["1", "2", "4"]


def test_a_sweep_lists_what_it_left_out_once_before_its_report(tmp_path, capsys, monkeypatch,
                                                                 two_cores):
    monkeypatch.setattr(sweep_command, "run_jobs", _ran(tmp_path))
    monkeypatch.setattr(sweep_command, "_commbench", lambda *a: print(f"$ commbench {a[0]}"))
    code, out, _ = exit_of(["sweep", "--np", "2,4", "--dist-optimizer", "none",
                            "--results-dir", str(tmp_path)], capsys)
    assert code == 0
    assert out.splitlines() == [CROWDED[2:], "$ commbench report", "$ commbench plot"]


@pytest.mark.parametrize("args, says", [
    (["--np", "4,8"], "argument --np: 4,8 worker(s): more than this machine's 2 physical "
                      "core(s), they would measure CPU sharing (--oversubscribe runs them)"),
    (["--emulate", "2x1", "--oversubscribe"],
     "argument --oversubscribe: only with --np; an emulated sweep runs each layout as given"),
])
def test_a_sweep_that_cannot_fit_is_one_line(tmp_path, capsys, two_cores, args, says):
    err = one_line_error(["sweep", "--dry-run", *args, "--results-dir", str(tmp_path)],
                         capsys)
    assert err == f"commbench: error: {says}\n"


def test_a_sweep_gives_topology_flags_only_to_strategies_with_a_topology(tmp_path):
    flags = ["--topology", "ring", "--atc-style", "--disable-dynamic-topology",
             "--batch-size", "8"]
    jobs = plan([2], ["allreduce", "neighbor_allreduce", "none"], flags, "mpiexec",
                str(tmp_path))
    assert [j.skip_reason for j in jobs] == [None, None, None]
    given = {j.strategy: j.command[j.command.index("-m") + 2:-2] for j in jobs}
    assert given["allreduce"] == ["--dist-optimizer=allreduce", "--batch-size", "8"]
    assert given["none"] == ["--dist-optimizer=none", "--batch-size", "8"]
    assert given["neighbor_allreduce"] == ["--dist-optimizer=neighbor_allreduce", *flags]


def test_options_are_taken_out_in_every_spelling():
    flags = ["--topology=ring", "--tag", "x", "--topology", "star", "--atc-style", "--lr", "1"]
    assert without_options(flags, {"--topology", "--atc-style"}, {"--atc-style"}) == [
        "--tag", "x", "--lr", "1"]


@pytest.mark.parametrize("strategies", ["allreduce", "allreduce,none,bogus"])
@pytest.mark.parametrize("given, flag", [(["--topology", "ring"], "--topology"),
                                         (["--topology=ring"], "--topology"),
                                         (["--topo", "ring"], "--topology"),
                                         (["--atc-style"], "--atc-style"),
                                         (["--disable-dyn"], "--disable-dynamic-topology")])
def test_a_flag_no_strategy_of_the_sweep_reads_is_refused_in_one_line(strategies, given,
                                                                      flag, tmp_path, capsys):
    """As `commbench run` refuses it, instead of a sweep that drops it and exits 0; an
    unknown strategy is no reader (its jobs are skipped, saying why)."""
    err = one_line_error(["sweep", "--dry-run", "--np", "2", "--dist-optimizer", strategies,
                          *given, "--results-dir", str(tmp_path)], capsys)
    known = strategies.replace(",bogus", "").replace(",", ", ")
    assert err == (f"commbench: error: argument {flag}: means nothing to any strategy of "
                   f"this sweep ({known}); leave it out\n")


def test_a_flag_at_its_default_is_no_mistake_for_a_sweep_as_for_a_run(tmp_path, capsys):
    from commbench.config.run_config import RunConfig

    default = RunConfig().topology
    code, out, _ = exit_of(["sweep", "--dry-run", "--np", "2", "--topology", default,
                            "--results-dir", str(tmp_path)], capsys)
    assert code == 0 and "--topology" not in out


@pytest.mark.parametrize("given", [["--topo", "ring"], ["--topo=ring"], ["--topology", "ring"]])
def test_an_abbreviated_flag_is_read_in_full_and_goes_where_the_full_one_goes(given,
                                                                              tmp_path):
    jobs = plan([2], ["allreduce", "neighbor_allreduce"], [*given, "--atc", "--batch", "8"],
                "mpiexec", str(tmp_path))
    assert [j.skip_reason for j in jobs] == [None, None]
    given_to = {j.strategy: j.command[j.command.index("-m") + 2:-2] for j in jobs}
    assert given_to["allreduce"] == ["--dist-optimizer=allreduce", "--batch-size", "8"]
    topology = ["--topology=ring"] if given == ["--topo=ring"] else ["--topology", "ring"]
    assert given_to["neighbor_allreduce"] == ["--dist-optimizer=neighbor_allreduce",
                                              *topology, "--atc-style", "--batch-size", "8"]


def test_a_mixed_sweep_with_an_abbreviated_flag_runs_every_strategy(tmp_path, capsys):
    code, out, _ = exit_of(["sweep", "--dry-run", "--np", "2", "--dist-optimizer",
                            "allreduce,neighbor_allreduce", "--topo", "ring",
                            "--results-dir", str(tmp_path)], capsys)
    allreduce, neighbor = out.splitlines()
    assert code == 0 and "--topo" not in allreduce and "--topology ring" in neighbor


def test_an_ambiguous_abbreviation_is_refused_in_one_line(tmp_path, capsys):
    err = one_line_error(["sweep", "--dry-run", "--np", "2", "--time", "9",
                          "--results-dir", str(tmp_path)], capsys)
    assert "ambiguous option: --time could match" in err


def test_a_sweep_refuses_a_speed_run_warm_up_once_up_front(tmp_path, capsys):
    err = one_line_error(["sweep", "--dry-run", "--np", "1,2", "--dist-optimizer",
                          "allreduce,none", "--warmup-epochs", "2", "--results-dir",
                          str(tmp_path)], capsys)
    assert err.startswith("commbench: error: argument --warmup-epochs: a speed run keeps")


def test_a_data_flag_at_its_default_is_taken_by_a_sweep(tmp_path, capsys):
    code, out, _ = exit_of(["sweep", "--dry-run", "--np", "1", "--partition", "iid",
                            "--data", "synthetic", "--results-dir", str(tmp_path)], capsys)
    assert code == 0 and "--partition iid --data synthetic" in out


# --- run: flags the strategy or the data would ignore ----------------------------------

def _config(*argv) -> RunConfig:
    return config_from_args(build_parser().parse_args(["run", *argv]))


@pytest.mark.parametrize("strategy", ["allreduce", "none", "gradient_allreduce", "horovod"])
@pytest.mark.parametrize("given, flag", [(["--topology", "ring"], "--topology"),
                                         (["--atc-style"], "--atc-style"),
                                         (["--disable-dynamic-topology"],
                                          "--disable-dynamic-topology")])
def test_a_topology_flag_is_refused_by_a_strategy_without_one(strategy, given, flag):
    from commbench import registry

    with pytest.raises(UsageError, match=f"^argument {flag}: means nothing to {strategy}, "):
        registry.refuse_unread([strategy], _config("--dist-optimizer", strategy, *given))


def test_the_run_refuses_it_before_any_communication():
    from commbench.job.run_checks import validate

    with pytest.raises(UsageError, match="^argument --topology: means nothing to allreduce"):
        validate(_config("--dist-optimizer", "allreduce", "--topology", "ring"), TWO_RANKS)


@pytest.mark.parametrize("strategy", ["neighbor_allreduce", "hierarchical_neighbor_allreduce"])
def test_strategies_with_a_topology_take_the_flags_and_the_default(strategy):
    from commbench import registry

    cls, two_machines = registry.resolve(strategy), ["--machine-size", "2"]
    cls.check(_config("--dist-optimizer", strategy, *two_machines), FOUR_RANKS)
    cls.check(_config("--dist-optimizer", strategy, *two_machines, "--topology", "ring",
                      "--atc-style", "--disable-dynamic-topology"), FOUR_RANKS)


def test_the_default_topology_is_no_mistake_for_a_strategy_without_one():
    from commbench import registry

    registry.resolve("allreduce").check(_config("--dist-optimizer", "allreduce"), TWO_RANKS)


def test_a_config_several_plugins_share_keeps_its_topology_flags(monkeypatch):
    """microbench checks every op's plugin against one config without --dist-optimizer:
    its --topology is meant for the neighbor ops, not a mistake for allreduce."""
    from argparse import Namespace

    from commbench import registry

    config = config_from_args(Namespace(topology="ring", disable_dynamic_topology=True))
    registry.refuse_unread(["allreduce", "neighbor_allreduce"], config, "op")
    with pytest.raises(UsageError, match="--disable-dynamic-topology: means nothing to any op"):
        registry.refuse_unread(["allreduce"], config, "op")


def test_a_topology_flag_for_a_strategy_without_one_is_one_line_exit_2(tmp_path):
    done = commbench("--dist-optimizer", "allreduce", "--topology", "ring", "--results-dir",
                     str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("commbench: error: argument --topology: means nothing to "
                                  "allreduce") and done.stderr.count("\n") == 1, done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (["--partition", "dirichlet:0.1"], "argument --partition: the synthetic batch"),
    (["--data", "synthetic", "--partition", "dirichlet:0.5"], "argument --partition: "),
    (["--warmup-epochs", "2"], "argument --warmup-epochs: a speed run keeps"),
])
def test_a_data_flag_that_means_nothing_is_refused(argv, message):
    with pytest.raises(UsageError, match=f"^{message}"):
        _config(*argv)


def test_the_same_data_flags_where_they_mean_something_are_taken():
    config = _config("--data", "learnable", "--partition", "dirichlet:0.1",
                     "--target-accuracy", "0.8", "--warmup-epochs", "2")
    assert (config.partition, config.warmup_epochs) == ("dirichlet:0.1", 2.0)
    assert _config().partition == "iid"


def test_a_sweep_with_a_data_flag_that_means_nothing_runs_no_job(tmp_path, capsys):
    err = one_line_error(["sweep", "--dry-run", "--np", "1", "--partition", "dirichlet:0.1",
                          "--results-dir", str(tmp_path)], capsys)
    assert "argument --partition: the synthetic batch" in err


# --- simulate: values refused at once, files that replace flags ------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN", "0", "-1", "fast"])
def test_simulate_refuses_an_img_sec_that_is_not_a_positive_finite_number(value, capsys,
                                                                         tmp_path):
    err = one_line_error(["simulate", f"--img-sec={value}", "--link", "1gbit", "-o",
                          str(tmp_path)], capsys)
    assert err.startswith("commbench simulate: error: argument --img-sec: must be a "
                          f"positive, finite number, got {value!r}")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flag", ["--batch-size", "--image-size", "--gpus-per-machine"])
def test_simulate_refuses_a_size_that_is_not_positive(flag, capsys, tmp_path):
    err = one_line_error(["simulate", f"{flag}=0", "--link", "1gbit", "-o", str(tmp_path)],
                         capsys)
    assert f"argument {flag}" in err and "must be a positive integer, got '0'" in err


@pytest.mark.parametrize("given, file", [
    (["--link", "1gbit"], BETWEEN_MACHINES),
    (["--latency", "5us"], BETWEEN_MACHINES),
    (["--intra-link", "100GB/s"], INSIDE_A_MACHINE),
    (["--intra-latency", "2us"], INSIDE_A_MACHINE),
])
def test_simulate_refuses_a_stated_link_its_nccl_tests_file_replaces(given, file, capsys,
                                                                    tmp_path):
    err = one_line_error(["simulate", "--nccl-tests", file, *given, "--img-sec", "300",
                          "-o", str(tmp_path)], capsys)
    assert err.startswith(f"commbench: error: argument {given[0]}: --nccl-tests {file} "
                          "measured the link ")
    assert not list(tmp_path.iterdir())


def test_simulate_takes_a_stated_link_of_a_class_its_files_did_not_measure():
    from argparse import Namespace

    from commbench.simulate.command import refuse_what_nccl_tests_replaces

    between = Namespace(nccl_tests=BETWEEN_MACHINES, link=None, latency=None,
                        intra_link="100GB/s", intra_latency="2us")
    refuse_what_nccl_tests_replaces(between)
    inside = Namespace(nccl_tests=INSIDE_A_MACHINE, link="25gbit", latency="5us",
                       intra_link=None, intra_latency=None)
    refuse_what_nccl_tests_replaces(inside)


def test_every_run_flag_is_owned_by_one_section():
    """RunConfig is its components' sections and nothing else: each flag declared once,
    by one section, so that which component reads it is known."""
    from commbench.config.flags import flag_fields
    from commbench.config.run_config import SECTIONS

    owned = [name for section in SECTIONS for name in section.names()]
    assert sorted(owned) == sorted(f.name for f in flag_fields(RunConfig))
    assert len(owned) == len(set(owned))


@pytest.mark.parametrize("argv, message", [
    (["--timeline-steps", "5"], "argument --timeline-steps: sets how many steps a --timeline"),
    (["--dist-optimizer", "local_sgd", "--machine-size", "1"],
     "argument --machine-size: means nothing to local_sgd with one period H"),
])
def test_a_flag_its_run_makes_moot_is_refused(argv, message):
    from commbench.job.run_checks import validate

    with pytest.raises(UsageError, match="^" + message):
        validate(_config(*argv), TWO_RANKS)


def test_local_sgd_reads_the_machine_size_with_two_periods():
    from commbench.job.run_checks import validate

    validate(_config("--dist-optimizer", "local_sgd", "--average-every", "2,4",
                     "--machine-size", "1"), TWO_RANKS)
