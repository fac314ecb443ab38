"""`commbench microbench`: size parsing (in process), and short sweeps through
mpiexec -n 2 and -n 4 that must have no wrong results, bytes-moved figures equal to
the closed forms, and a report and charts that render."""

import io
import json
import math
from pathlib import Path

import pytest

from commbench.config import flags
from commbench.errors import UsageError
from commbench.microbench import command as microbench
from launchers import mpiexec

SWEEP = ["-m", "commbench", "microbench", "-b", "8", "-e", "64K", "-f", "32", "-n", "2",
         "-w", "1"]
# Horovod's op needs Horovod (tests/test_horovod.py runs it)
ALL_OPS = ",".join(op for op in microbench.ops.OPS if op != "horovod")


def test_sizes_follow_nccl_tests_flags():
    assert microbench.size("8") == 8
    assert microbench.size("4K") == 4096
    assert microbench.size("64M") == 64 << 20
    assert microbench.size("1g") == 1 << 30
    for bad in ("0", "-1", "12X", ""):
        with pytest.raises(Exception):
            microbench.size(bad)
    assert microbench.sizes(8, 64 << 20, 2)[-1] == 64 << 20
    assert microbench.sizes(8, 1024, 4) == [8, 32, 128, 512]
    assert microbench.sizes(1, 8, 2) == [4, 8]  # whole float32 elements, no duplicates
    with pytest.raises(UsageError):
        microbench.sizes(64, 8, 2)
    ops = flags.names_from(microbench.ops.OPS)
    assert ops("allreduce,allreduce") == ["allreduce"]
    with pytest.raises(Exception):
        ops("allgather")


def test_every_size_measured_other_than_asked_is_named_in_one_line():
    assert microbench.rounded_sizes(8, 1024, 4) is None
    assert microbench.rounded_sizes(7, 7, 2) == (
        "# sizes measured in whole float32 elements (4 bytes each), not as asked (bytes): "
        "7 -> 4")
    many = microbench.rounded_sizes(1, 1 << 20, 3)
    assert "1 -> 4, 3 -> 4, 9 -> 8, 27 -> 24, 81 -> 80, 243 -> 240, ..." in many
    assert many.endswith("(13 in all)") and "\n" not in many


@pytest.mark.job
def test_a_size_that_is_not_whole_float32_elements_is_said_and_recorded(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "commbench", "microbench", "-b", "7", "-e",
                           "7", "-n", "1", "-w", "0", "--op", "allreduce", "--no-raw",
                           "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert microbench.rounded_sizes(7, 7, 2) + "\n" in done.stdout
    doc = json.loads(next(tmp_path.glob("*.json")).read_text())
    assert doc["config"]["minbytes"] == 7 and doc["summary"]["sizes"] == [4]


def sweep(tmp_path, n, *flags):
    proc = mpiexec(n, [*SWEEP, "--results-dir", str(tmp_path), *flags], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Out of bounds values : 0 OK" in proc.stdout
    files = list(Path(tmp_path).glob("*.json"))
    assert len(files) == 1
    doc = json.loads(files[0].read_text())
    assert doc["kind"] == "microbench" and doc["schema_version"] >= 1
    assert doc["environment"]["world_size"] == n and doc["summary"]["wrong"] == 0
    ours = [r for r in doc["rows"] if r["commbench"]]
    assert ours and all(r["wrong"] == 0 for r in ours)
    return doc


def rows(doc, op, impl=None):
    return [r for r in doc["rows"] if r["op"] == op and (impl is None or r["impl"] == impl)]


def check_closed_forms(doc, n, static=True):
    sizes = doc["summary"]["sizes"]
    for r in rows(doc, "allreduce") + rows(doc, "local_sgd"):  # ring: 2(n-1)/n S each way
        assert r["bytes_sent"] == pytest.approx(2 * (n - 1) / n * r["bytes"])
        assert r["bytes_received"] == r["bytes_sent"]
        assert r["summary"]["busbw"] == pytest.approx(r["summary"]["algbw"] * 2 * (n - 1) / n)
    hops = math.ceil(math.log2(n)) if static else 1  # exponential-2 / its one-peer schedule
    for r in rows(doc, "neighbor_allreduce"):
        assert r["bytes_sent"] == pytest.approx(hops * r["bytes"])
        assert r["bytes_received"] == pytest.approx(hops * r["bytes"])
        assert all(s == pytest.approx(hops * r["bytes"]) for s in r["bytes_sent_per_rank"])
    for op in doc["config"]["ops"]:
        ours = rows(doc, op, "commbench")
        if op == "neighbor_allreduce":  # transfer only, and the same whole operation
            assert all({"gloo send/recv", "gloo send/recv + combine", "MPI Neighbor_allgather",
                        "MPI Neighbor_allgather + combine"} <= set(r["summary"]["ratio_to_raw"])
                       for r in ours)
        assert [r["bytes"] for r in ours] == sizes
        assert all(r["summary"]["ratio_to_raw"] for r in ours)  # a raw reference each


def test_raw_combine_rows_fail_on_a_wrong_result():
    """The "+ combine" rows are checked in reset(), before their next call."""
    from types import SimpleNamespace

    import torch

    from commbench.microbench.ops import neighbor_allreduce as microbench_raw
    from commbench.microbench.ops.base import Data
    from commbench.topology import build_schedule

    ctx = SimpleNamespace(device=torch.device("cpu"), world_size=4, rank=1)
    data = Data(ctx, 64)
    schedule = build_schedule("exponential-2", 4, dynamic=False)
    x = data.fresh()
    phases = microbench_raw._Phases(1, schedule)
    reset = microbench_raw._checked_reset("raw", 1, data, x, phases)
    reset()  # no call yet: nothing to check
    phases.next()
    # The right output of the call passes, X_r itself (no averaging) does not.
    x.copy_(sum(w * (data.c[j] * data.base + data.d[j]) for j, w in enumerate(phases.rows[0])))
    reset()
    phases.next()
    with pytest.raises(RuntimeError, match="wrong result at call 1"):
        reset()


@pytest.mark.mpi
def test_two_ranks_all_ops_static(tmp_path):
    doc = sweep(tmp_path, 2, "--op", ALL_OPS, "--disable-dynamic-topology",
                "--machine-size", "1")
    check_closed_forms(doc, 2)
    impls = {r["impl"] for r in rows(doc, "allreduce")}
    assert {"commbench", "torch all_reduce", "MPI Allreduce"} <= impls
    # on one machine under mpiexec `auto` moves every op over MPI, and each row says so;
    # local_sgd's meeting is torch's helper, over torch.distributed's backend
    carried = {(r["op"], r["transport"]) for r in doc["rows"] if r["commbench"]}
    assert carried == {(op, "gloo" if op == "local_sgd" else "mpi")
                       for op in ALL_OPS.split(",")}
    assert all(r["transport"] is None for r in doc["rows"] if not r["commbench"])


@pytest.mark.mpi
def test_four_ranks_all_ops_static_then_report_and_charts(tmp_path):
    results = tmp_path / "results"
    doc = sweep(results, 4, "--op", ALL_OPS, "--disable-dynamic-topology", "--machine-size", "2")
    check_closed_forms(doc, 4)
    # Hierarchical, 2 machines of 2: every rank allreduces inside its machine (S each
    # way); the leader also sends S to the other machine and broadcasts S to its peer.
    for r in rows(doc, "hierarchical_neighbor_allreduce"):
        assert r["bytes_sent"] == pytest.approx(2 * r["bytes"])

    from commbench.analysis.plot_command import plot
    from commbench.analysis.report import report

    out, err = io.StringIO(), io.StringIO()
    assert report([results], "text", out=out, err=err) == 0
    text = out.getvalue()
    assert "microbench, 4 ranks" in text and "neighbor_allreduce" in text and not err.getvalue()
    out = io.StringIO()
    assert report([results], "json", out=out, err=err) == 0
    assert json.loads(out.getvalue())["microbench"][0]["rows"]
    out = io.StringIO()
    assert plot([results], tmp_path / "charts", ["svg"], out=out, err=err) == 0
    charts = out.getvalue().split()
    assert len(charts) == 2 and all(Path(c).stat().st_size > 10_000 for c in charts)


@pytest.mark.mpi
def test_four_ranks_one_peer_schedule_sends_one_buffer(tmp_path):
    doc = sweep(tmp_path, 4, "--op", "neighbor_allreduce")
    check_closed_forms(doc, 4, static=False)


def test_a_contender_is_set_against_the_emulated_links_rate_and_flagged():
    from commbench.microbench import link

    network = {"nic": "eth0", "link_bits_per_second": 200e6}
    assert link.own_rate(network) == 200e6 and link.own_rate(None) is None
    assert link.fraction_of_rate([(20e6, 200e6)]) == pytest.approx(0.8)
    assert link.fraction_of_rate([(20e6, None)]) is None  # not an emulated cluster
    assert link.flag(None) == "-"
    assert link.flag(0.46) == "0.46 (slow)"
    assert link.flag(0.93) == "0.93"
    assert link.flag(1.32) == "1.32 (burst)"
    assert link.counter(None, 0) is None and link.counter(network, 1) is None  # first rank only


def test_each_call_on_an_emulated_link_starts_with_the_rate_limiters_bucket_full():
    from commbench.cluster.state import Cluster
    from commbench.microbench import link

    slow = Cluster("cb-t", 2, 1, "200mbit", "10.213.7.0/24").describe()
    fast = Cluster("cb-t", 2, 1, "1gbit", "10.213.7.0/24").describe()
    assert link.refill_seconds(slow) == pytest.approx(64 * 1024 * 8 / 200e6)  # the 64 KB floor
    assert link.refill_seconds(fast) == pytest.approx(0.002)  # 2 ms of the rate
    assert link.refill_seconds(None) == 0.0  # a real machine: no pause
    # recorded before bursts were
    assert link.refill_seconds({"link_bits_per_second": 200e6}) == 0.0
    # uneven links: the slowest machine's bucket takes longest to refill
    uneven = Cluster("cb-t", 2, 1, "1gbit", "10.213.7.0/24", {"m1": "100mbit"}).describe()
    assert link.refill_seconds(uneven) == pytest.approx(64 * 1024 * 8 / 100e6)


def test_on_uneven_links_each_machine_is_set_against_its_own_rate():
    from commbench.cluster.state import Cluster
    from commbench.microbench import link

    network = Cluster("cb-t", 3, 1, "1gbit", "10.213.7.0/24", {"m2": "100mbit"}).describe()
    assert network["links"] == {"cb-t-m0": "1gbit", "cb-t-m1": "1gbit", "cb-t-m2": "100mbit"}
    assert network["link_of"] == {"m2": "100mbit"}
    assert link.own_rate(network, "cb-t-m2") == 100e6
    assert link.own_rate(network, "cb-t-m0") == 1e9
    # the fast machines at half their rate, the slow one at all of its own
    machines = [(62.5e6, 1e9), (62.5e6, 1e9), (12.5e6, 100e6)]
    assert link.fraction_of_rate(machines) == pytest.approx((0.5 + 0.5 + 1.0) / 3)


@pytest.mark.mpi
def test_two_ranks_compressed_ops_send_half_and_stay_within_its_rounding(tmp_path):
    """--compression fp16: commbench's rows hold the average within fp16's rounding
    (checked on every call), count half the bytes on the wire, give their bandwidths in
    both units, and stand beside the bare fp16 collective."""
    doc = sweep(tmp_path, 2, "--op", "allreduce,neighbor_allreduce", "--compression", "fp16",
                "--disable-dynamic-topology", "--machine-size", "1")
    assert doc["config"]["compression"] == "fp16"
    for op in ("allreduce", "neighbor_allreduce"):
        for ours in rows(doc, op, "commbench"):
            fp32 = rows(doc, op, "torch all_reduce" if op == "allreduce" else "gloo send/recv")
            fp32 = next(r for r in fp32 if r["bytes"] == ours["bytes"])
            assert ours["bytes_sent"] == pytest.approx(fp32["bytes_sent"] / 2)
            s = ours["summary"]
            assert s["wire_fraction"] == 0.5 and "wire_fraction" not in fp32["summary"]
            bw = "busbw" if op == "allreduce" else "link_bw"
            assert s[f"{bw}_sent"] == pytest.approx(s[bw] / 2)
    narrow = rows(doc, "allreduce", "torch all_reduce fp16")
    assert narrow and all(r["summary"]["wire_fraction"] == 0.5 for r in narrow)
    assert all("torch all_reduce fp16" in r["summary"]["ratio_to_raw"]
               for r in rows(doc, "allreduce", "commbench"))


@pytest.mark.job
def test_powersgd_is_refused_in_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *SWEEP, "--op", "allreduce", "--compression",
                           "powersgd:2", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "argument --compression: powersgd:2 approximates a model's gradient" in done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.job
def test_a_step_factor_with_one_size_is_refused_in_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "commbench", "microbench", "--op",
                           "allreduce", "-b", "64K", "-e", "64K", "-f", "4",
                           "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == (
        "commbench: error: argument -f/--stepfactor: -b and -e give one size (65536 bytes), "
        "which a step factor does not change; leave it out\n"), done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.job
def test_compression_is_refused_for_the_local_sgd_op_in_one_line(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *SWEEP, "--op", "allreduce,local_sgd",
                           "--compression", "bf16", "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert "argument --compression: means nothing to the local_sgd op" in done.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.job
@pytest.mark.parametrize("given, flag", [(["--topology", "ring"], "--topology"),
                                         (["--machine-size", "2"], "--machine-size")])
def test_a_flag_no_op_reads_is_refused_in_one_line(given, flag, tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, *SWEEP, "--op", "allreduce", *given,
                           "--results-dir", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr == (
        f"commbench: error: argument {flag}: means nothing to any op of this microbench "
        "(allreduce); leave it out\n"), done.stderr
    assert not list(tmp_path.iterdir())
