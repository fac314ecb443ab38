"""--compression: the flag and who takes what (in-process); torch's hooks watched, so that
each allreduce is a piece with the bytes it carried and the work between is codec time;
the codec's own part of the step split; a sweep that gives it only where it means
something; and through mpiexec a compressed run, PowerSGD's measured rate, and bad
requests that end every rank in one line. Numbers against the dense reference (fp16,
bf16 within their rounding; PowerSGD at full rank and its error feedback):
tests/programs/check_strategies.py, run by the strategies' own test files."""

import pytest

from cli_helpers import commbench
from commbench import registry
from commbench.config import compression
from commbench.cli import build_parser
from commbench.config.run_config import RunConfig, config_from_args
from commbench.errors import UsageError
from commbench.launch.detect import LaunchInfo
from commbench.launch.groups import MachineFlags
from commbench.timing.spans import Span
from commbench.timing.step_split import PARTS, split_step
from commbench.sweep.plan import plan
from programs.check_strategies import CHECKS_TIMEOUT, assert_strategy_clean
from programs.commbench_runs import assert_usage_error, run_commbench

TWO_RANKS = LaunchInfo("openmpi", 0, 2, 0, 2, 0)


def _config(*argv) -> RunConfig:
    return config_from_args(build_parser().parse_args(["run", *argv]))


# --- the flag ----------------------------------------------------------------------


@pytest.mark.parametrize("text, kind, rank, start, min_rate", [
    ("none", "none", 0, 2, 2.0), ("fp16", "fp16", 0, 2, 2.0), ("bf16", "bf16", 0, 2, 2.0),
    ("powersgd:4", "powersgd", 4, 2, 2.0),
    ("powersgd:1,start=10,min_rate=0.5", "powersgd", 1, 10, 0.5)])
def test_a_compression_reads_as_torch_names_its_settings(text, kind, rank, start, min_rate):
    found = compression.parse(text)
    assert (found.kind, found.rank, found.start, found.min_rate) == (kind, rank, start, min_rate)
    assert compression.spec(text) == text  # recorded as typed, defaults left out


@pytest.mark.parametrize("text", ["powersgd:0", "powersgd", "powersgd:x", "powersgd:4,start=1",
                                  "powersgd:4,min_rate=0", "powersgd:4,rank=2", "fp8",
                                  "fp16:2", "powersgd:4,start=3,start=4"])
def test_a_bad_compression_is_one_line_and_exit_2(text, capsys):
    with pytest.raises(SystemExit) as ended:
        build_parser().parse_args(["run", "--compression", text])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "argument --compression: must be none, fp16, bf16 or " \
        "powersgd:RANK" in err and repr(text) in err


def test_fp16_allreduce_is_compression_fp16_and_cannot_contradict_it():
    assert compression.of(_config("--fp16-allreduce")) == compression.Compression("fp16")
    assert compression.of(_config("--fp16-allreduce", "--compression", "fp16")).kind == "fp16"
    with pytest.raises(UsageError, match="^argument --compression: bf16 and --fp16-allreduce"):
        compression.of(_config("--fp16-allreduce", "--compression", "bf16"))


@pytest.mark.parametrize("strategy, given, message", [
    ("local_sgd", "bf16", "argument --compression: means nothing to local_sgd, which "
     "compresses nothing"),
    ("none", "fp16", "argument --compression: means nothing to none, which compresses nothing"),
    ("neighbor_allreduce", "powersgd:4", "argument --compression: neighbor_allreduce cannot "
     "send powersgd; it takes fp16, bf16"),
    ("gradient_allreduce", "powersgd:1", "argument --compression: gradient_allreduce cannot "
     "send powersgd"),
    ("horovod", "bf16", "argument --compression: horovod cannot send bf16; it takes fp16")])
def test_a_strategy_refuses_what_it_cannot_send(strategy, given, message):
    config = _config("--dist-optimizer", strategy, "--compression", given)
    with pytest.raises(UsageError, match="^" + message.replace("(", r"\(")):
        registry.refuse_unread([strategy], config, launch=TWO_RANKS)
        registry.resolve(strategy).check(config, TWO_RANKS)


@pytest.mark.parametrize("strategy, kinds", [
    ("allreduce", ("fp16", "bf16", "powersgd:2")), ("neighbor_allreduce", ("fp16", "bf16")),
    ("hierarchical_neighbor_allreduce", ("fp16", "bf16")),
    ("gradient_allreduce", ("fp16", "bf16")), ("horovod", ("fp16",))])
def test_each_strategy_takes_what_it_lists(strategy, kinds):
    from commbench.launch.gpus import torch_older_than

    cls = registry.resolve(strategy)
    assert [k if k != "powersgd" else "powersgd:2" for k in cls.compressions] == list(kinds)
    for kind in kinds:
        if kind.startswith("powersgd") and torch_older_than(2, 0):
            with pytest.raises(UsageError, match="needs torch >= 2.0 here"):
                cls.check(_config("--compression", kind), TWO_RANKS)
            continue
        machines = ["--machine-size", "1"] if MachineFlags in cls.reads() else []
        cls.check(_config("--dist-optimizer", strategy, "--compression", kind, *machines),
                  TWO_RANKS)


def test_a_speed_run_times_only_steps_powersgd_compressed():
    pytest.importorskip("torch.utils.flop_counter", reason="PowerSGD here needs torch >= 2")
    allreduce = registry.resolve("allreduce")
    allreduce.check(_config("--compression", "powersgd:1,start=10"), TWO_RANKS)
    with pytest.raises(UsageError, match="^argument --compression: PowerSGD sends plain "
                                         "allreduce until step 11 .* give --num-warmup-batches "
                                         "11 or more$"):
        allreduce.check(_config("--compression", "powersgd:1,start=11"), TWO_RANKS)
    allreduce.check(_config("--compression", "powersgd:1,start=11", "--data", "learnable",
                            "--target-accuracy", "0.5"), TWO_RANKS)  # training: its steps


def test_mpi_cannot_carry_a_compressed_allreduce():
    config = _config("--compression", "bf16", "--cpu-transport", "mpi")
    with pytest.raises(UsageError, match="^argument --cpu-transport: mpi cannot carry "
                                         "--compression bf16"):
        registry.resolve("allreduce").check(config, TWO_RANKS)


def test_powersgd_at_a_rank_no_layer_allows_names_the_largest_that_helps():
    import torch

    model = torch.nn.Linear(6, 4)  # 4 x 6: shrinks more than 2 times at rank 1 only
    compression.refuse_useless_rank(compression.parse("powersgd:1"), model, "linear")
    with pytest.raises(UsageError, match=r"^argument --compression: powersgd:2 compresses no "
                                         r"layer of linear .*; use powersgd:1 or a lower rank$"):
        compression.refuse_useless_rank(compression.parse("powersgd:2"), model, "linear")
    # as torch decides: rows x everything else, the rank capped at the smaller side
    assert compression.compresses((64, 3, 3, 3), 4, 2.0)
    assert not compression.compresses((10,), 1, 2.0)  # a bias is sent whole


# --- watched hooks: pieces and codec --------------------------------------------------


class _Work:
    def __init__(self, tensors):
        import torch

        self.future = torch.futures.Future()
        self.future.set_result(tensors)

    def get_future(self):
        return self.future

    def wait(self):
        return True


class _Group:
    def __init__(self):
        self.calls = []

    def allreduce(self, tensors, opts):
        self.calls.append([t.dtype for t in tensors])
        return _Work(tensors)


def test_a_watched_group_records_each_allreduce_with_its_bytes_and_the_work_between():
    import torch

    from commbench.timing import spans
    from commbench.comm.watched_group import WatchedGroup

    with spans.Recorder().measured_step() as recorder:
        real = _Group()
        group = WatchedGroup(real, ranks=4)
        work = group.allreduce([torch.zeros(100, dtype=torch.float16)], None)
        assert work.get_future().wait()[0].dtype == torch.float16
        group.allreduce([torch.zeros(10)], None).wait()
        group.done()
        kinds = [(e.kind, e.nbytes, e.sent) for e in recorder.events]
    assert group.size() == 4 and real.calls == [[torch.float16], [torch.float32]]
    # a ring over 4 ranks: 2 (n - 1) chunks of a quarter each
    assert kinds == [("codec", 0, 0), ("comm", 200, 6 * 50), ("codec", 0, 0),
                     ("comm", 40, 6 * 10), ("codec", 0, 0)]


def _split(*spans_):
    kinds = {}
    for kind, start, end in spans_:
        kinds.setdefault(kind, []).append(Span(0, kind, start, end))
    from commbench.timing.step_split import on_rank_0s_clock

    by_kind = on_rank_0s_clock([s for k in kinds.values() for s in k], 0.0)[0]
    return dict(zip(PARTS, split_step(by_kind, 0, 0, [{}], range(1))))


def test_codec_on_the_steps_thread_is_taken_out_of_compute():
    parts = _split(("step", 0.0, 10.0), ("backward", 0.0, 8.0), ("codec", 2.0, 3.0),
                   ("wait", 8.0, 10.0))
    assert parts["codec"] == 1.0 and parts["compute"] == 7.0 and parts["exposed"] == 2.0
    assert sum(parts[p] for p in ("compute", "codec", "exposed", "waiting", "other")) == 10.0


def test_codec_in_a_callback_counts_only_where_the_step_waits_for_it():
    parts = _split(("step", 0.0, 10.0), ("backward", 0.0, 8.0),
                   ("codec-callback", 5.0, 6.0),  # beside backward: hidden
                   ("codec-callback", 9.0, 9.5), ("wait", 8.0, 10.0))
    assert parts["codec"] == 0.5 and parts["compute"] == 8.0 and parts["exposed"] == 1.5


def test_a_result_split_before_codec_existed_still_reads(tmp_path):
    import io
    import json
    import shutil
    from pathlib import Path

    from commbench.analysis import report

    runs = tmp_path / "runs"
    shutil.copytree(Path(__file__).parent / "data" / "runs-new", runs)
    for path in runs.glob("*-allreduce-n2-*.json"):
        doc = json.loads(path.read_text())
        doc["summary"]["step_split"] = {k: {"mean": 0.1, "median": 0.1, "p10": 0.1,
                                            "p90": 0.1} for k in PARTS if k != "codec"}
        path.write_text(json.dumps(doc))
    out, err = io.StringIO(), io.StringIO()
    assert report.report([runs], out=out, err=err) == 0
    assert "skipping" not in err.getvalue() and "Where a step's time goes" in out.getvalue()


# --- sweep --------------------------------------------------------------------------


def test_a_sweep_gives_compression_where_it_means_something(tmp_path):
    pytest.importorskip("torch.utils.flop_counter", reason="PowerSGD here needs torch >= 2")
    jobs = plan([2], ["allreduce", "local_sgd", "neighbor_allreduce"],
                ["--compression", "powersgd:2"], "mpiexec", str(tmp_path))
    reasons = {j.strategy: j.skip_reason for j in jobs}
    given = {j.strategy: j.command for j in jobs}
    assert reasons["allreduce"] is None and "powersgd:2" in given["allreduce"]
    assert reasons["local_sgd"] is None and "--compression" not in given["local_sgd"]
    assert reasons["neighbor_allreduce"].startswith("argument --compression: "
                                                    "neighbor_allreduce cannot send powersgd")


def test_list_says_what_each_strategy_can_send():
    done = commbench("list")
    assert done.returncode == 0
    lines = [line.strip() for line in done.stdout.splitlines()]
    after = lines[lines.index(next(x for x in lines if x.startswith("allreduce "))):]
    assert "--compression: fp16, bf16, powersgd:RANK" in after[:4], done.stdout
    local = after[after.index(next(x for x in after if x.startswith("local_sgd "))):][:4]
    assert not any(x.startswith("--compression") for x in local), done.stdout


# --- through mpiexec ----------------------------------------------------------------


@pytest.mark.timeout(CHECKS_TIMEOUT)
@pytest.mark.mpi
@pytest.mark.parametrize("n", [2, 3])
def test_compressed_averages_match_the_dense_reference(n):
    """fp16 and bf16 within their rounding, PowerSGD exact at full rank and carrying its
    error at rank 1: tests/programs/check_strategies.py."""
    assert_strategy_clean(n, "allreduce")


@pytest.mark.mpi
def test_a_powersgd_run_records_its_rate_bytes_and_codec(tmp_path):
    doc = run_commbench(2, "allreduce", ["--compression", "powersgd:2",
                                         "--num-warmup-batches", "2"], tmp_path)
    facts = doc["strategy"]
    assert facts["compression"] == "powersgd:2"
    assert facts["powersgd"]["compression_rate"] > 50  # resnet18 at rank 2
    # the projection's model of the hook sends what the hook said it sent
    from commbench.simulate import powersgd
    from commbench.simulate.compute import gradients

    assert powersgd.compression_rate(gradients("resnet18", 32), 2, 2.0) == pytest.approx(
        facts["powersgd"]["compression_rate"], rel=1e-9)
    assert facts["powersgd"]["start_powerSGD_iter"] == 2
    uncompressed = 4 * 11_689_512  # resnet18's float32 gradients, 1000 classes: a ring of
    assert doc["summary"]["wire"]["bytes_per_step"] < uncompressed / 50  # 2 sends them once
    assert doc["summary"]["step_split"]["codec"]["mean"] > 0


@pytest.mark.mpi
@pytest.mark.parametrize("flags, message", [
    (["--compression", "powersgd:100000", "--num-warmup-batches", "2"],
     "argument --compression: powersgd:100000 "
     "compresses no layer of resnet18"),
    (["--dist-optimizer=local_sgd", "--compression", "bf16"], "argument --compression: means "
     "nothing to local_sgd"),
    (["--dist-optimizer=neighbor_allreduce", "--compression", "powersgd:4"],
     "neighbor_allreduce cannot send powersgd")])
def test_a_bad_compression_ends_every_rank_in_one_line(flags, message, tmp_path):
    assert_usage_error(2, flags, message, tmp_path)


def test_report_shows_a_compressed_allreduce_beside_the_plain_one(tmp_path):
    import io
    import json
    import shutil
    from pathlib import Path

    from commbench.analysis import report

    runs = tmp_path / "runs"
    shutil.copytree(Path(__file__).parent / "data" / "runs-new", runs)
    plain = next(p for p in runs.glob("*-allreduce-n2-*.json")
                 if not json.loads(p.read_text())["config"].get("fp16_allreduce"))
    doc = json.loads(plain.read_text())
    doc["config"]["compression"] = doc["strategy"]["compression"] = "powersgd:4"
    (runs / ("compressed-" + plain.name)).write_text(json.dumps(doc))
    out = io.StringIO()
    assert report.report([runs], out=out, err=io.StringIO()) == 0
    group = next(g for g in out.getvalue().split("\n\n\n") if "powersgd:4" in g)
    rows = [line.split()[:3] for line in group.splitlines() if line.startswith("allreduce")]
    assert ["allreduce", "-", "2"] in rows and ["allreduce", "powersgd:4", "2"] in rows


def test_simulate_projects_a_powersgd_run_as_itself_not_as_plain_allreduce(tmp_path):
    import json
    from pathlib import Path

    pytest.importorskip("torch.utils.flop_counter", reason="commbench simulate needs torch >= 2.1")

    runs = tmp_path / "runs"
    runs.mkdir()
    for path in (Path(__file__).parent / "data" / "runs-new").glob(
            "*-resnet18-allreduce-n[12]-*.json"):
        doc = json.loads(path.read_text())
        if doc["summary"]["workers"] == 2:
            doc["config"]["compression"] = doc["strategy"]["compression"] = "powersgd:4"
        (runs / path.name).write_text(json.dumps(doc))
    done = commbench("simulate", str(runs), "--np", "1,2", "--link", "10gbit",
                     "--img-sec", "300", "-o", str(tmp_path / "p"))
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()]
    # the compressed runs' own series, set beside their measurement; the plain ones' apart
    assert any(r[:3] == ["allreduce", "(powersgd:4)", "2"] and "measured" in r for r in rows)
    assert any(r[:2] == ["allreduce", "1"] and "measured" in r for r in rows)
    assert "allreduce (powersgd:4): torch's PowerSGD hook's bytes" in " ".join(
        done.stdout.split())


def test_a_piece_a_callback_posts_is_no_hand_over_of_the_step():
    from commbench.timing import spans

    with spans.Recorder().measured_step():
        spans.record("comm", 1.0, 2.0)  # DDP hands a bucket over
        spans.record("comm", 5.0, 6.0, aside=True)  # PowerSGD's Q, from a callback
        assert spans.last_post() == 1.0


def test_waiting_is_never_also_codec():
    parts = _split(("step", 0.0, 10.0), ("backward", 0.0, 6.0), ("wait", 6.0, 10.0),
                   ("codec-callback", 6.0, 7.0))
    # every peer had posted long before (lateness 0), so the wait is the rank's own
    assert parts["waiting"] == 0.0 and parts["codec"] == 1.0 and parts["exposed"] == 3.0
