"""Engines as they schedule (commbench.simulate.engines and the steps built on them):
Horovod's and Bluefog's defaults, the cycle that collects ready tensors and fuses them
up to the threshold, the negotiation's rounds growing with the rank count, the
coordination part of the step split, Bluefog's posting after forward and its fused
receive buffers, and the --horovod-version flag. Single process, fast."""

import argparse
import json
import math
from importlib import metadata

import pytest

pytest.importorskip("torch.utils.flop_counter", reason="commbench simulate needs torch >= 2.1")

from commbench.errors import UsageError  # noqa: E402
from commbench.simulate import calibrate, compute, costs, engines, projection_file  # noqa: E402
from commbench.simulate.command import add_arguments  # noqa: E402
from commbench.simulate.link_costs import Link, Network  # noqa: E402
from commbench.simulate.project import Inputs, project  # noqa: E402
from commbench.simulate.step import StepTime, simulate  # noqa: E402
from commbench.simulate.strategy import Strategy  # noqa: E402

MIB = 1 << 20
NET = Network(Link(3e-6, 1 / 120e9), Link(40e-6, 8 / 13.5e9))


def _compute(backward=0.1):
    return compute.Compute(backward / 2, backward, 0.0, ())


# -- defaults, as the engines' code sets them ------------------------------------------

def test_horovod_and_bluefog_defaults_are_the_engines_own():
    assert (engines.horovod().cycle, engines.horovod().fusion_bytes) == (1e-3, 128 * MIB)
    assert (engines.horovod("0.20").cycle, engines.horovod("0.20").fusion_bytes) == (5e-3, 64 * MIB)
    assert engines.horovod("0.16").negotiation == engines.GATHER  # before the response cache
    assert engines.horovod().negotiation == engines.CACHE
    assert (engines.BLUEFOG.cycle, engines.BLUEFOG.fusion_bytes) == (0.5e-3, 8 * MIB)
    assert engines.BLUEFOG.negotiation == engines.GATHER and engines.BLUEFOG.fused_receives
    assert engines.DDP.negotiation == engines.NONE


def test_the_default_horovod_line_is_the_installed_horovods():
    try:
        installed = metadata.version("horovod")
    except metadata.PackageNotFoundError:
        pytest.skip("horovod is not installed here")
    major, minor = (int(v) for v in installed.split(".")[:2])
    low, high = (int(v.split(".")[1]) for v in engines.horovod().version.split("-"))
    assert major == 0 and low <= minor <= high


def test_an_unknown_horovod_release_is_one_line():
    with pytest.raises(UsageError, match="--horovod-version: no defaults known for '0.99'"):
        engines.horovod("0.99")
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--dist-optimizer", "horovod", "--horovod-version", "0.99"])
    with pytest.raises(UsageError, match="0.99"):
        calibrate.strategies_to_project(args, [])
    args = parser.parse_args(["--dist-optimizer", "horovod,allreduce", "--horovod-version", "0.20"])
    labels = [s.label() for s in calibrate.strategies_to_project(args, [])]
    assert labels == ["horovod (0.17-0.20 defaults)", "allreduce"]


# -- the cycle, fusion and negotiation -----------------------------------------------

def test_a_cycle_fuses_what_is_ready_up_to_the_threshold_in_order():
    engine = engines.Engine("e", "-", 1e-3, 10.0, engines.CACHE)
    posted = [(4, 0.0001), (4, 0.0002), (4, 0.0003), (4, 0.0015), (20, 0.0016)]
    fused = engines.launches(engine, posted, 0.0002)
    # cycle 1 (t = 1 ms) takes the first three: 4 + 4 fit, the third starts a new buffer;
    # cycle 2 (2 ms) the last two; a tensor above the threshold goes alone
    assert fused == [(8.0, pytest.approx(0.0012)), (4.0, pytest.approx(0.0012)),
                     (4.0, pytest.approx(0.0022)), (20.0, pytest.approx(0.0022))]
    # without the cycle and the negotiation each buffer leaves when its last tensor is in
    assert engines.at_readiness(fused, posted) == [(8.0, 0.0002), (4.0, 0.0003),
                                                   (4.0, 0.0015), (20.0, 0.0016)]


def test_a_negotiation_longer_than_the_cycle_stretches_it():
    engine = engines.Engine("e", "-", 1e-3, 100.0, engines.GATHER)
    fused = engines.launches(engine, [(1, 0.0), (1, 0.0025)], 0.002)
    assert [t for _, t in fused] == [pytest.approx(0.004), pytest.approx(0.006)]


def test_bluefog_fuses_its_receive_buffers_too():
    posted = [(MIB, 0.0)] * 16
    one_peer = engines.launches(engines.BLUEFOG, posted, 0.0, receives=1)
    static = engines.launches(engines.BLUEFOG, posted, 0.0, receives=3)
    assert max(b for b, _ in one_peer) == 4 * MIB and len(one_peer) == 4
    assert max(b for b, _ in static) == 2 * MIB and len(static) == 8


def test_the_negotiation_grows_with_the_rank_count_in_rounds():
    alpha_in, alpha_out = NET.intra.alpha, NET.inter.alpha
    cache = [engines.negotiation_seconds(engines.horovod(), p, 8, NET) for p in (8, 16, 64, 128)]
    assert cache == pytest.approx([3 * alpha_in, 3 * alpha_in + alpha_out,
                                   3 * alpha_in + 3 * alpha_out, 3 * alpha_in + 4 * alpha_out])
    gather = engines.negotiation_seconds(engines.BLUEFOG, 128, 8, NET)
    assert gather == pytest.approx(3 * cache[-1] + alpha_out)  # gather, gatherv, 2 broadcasts
    assert engines.negotiation_seconds(engines.DDP, 128, 8, NET) == 0.0
    assert engines.negotiation_seconds(engines.horovod(), 1, 8, NET) == 0.0


# -- the step and its split ----------------------------------------------------------

def test_horovods_step_shows_its_coordination_and_ddps_has_none():
    grads, c = compute.gradients("resnet50", 224), _compute(0.12)
    layout = costs.Layout(128, 8)
    horovod = simulate(Strategy("horovod"), layout, c, grads, NET, False)
    ddp = simulate(Strategy("allreduce"), layout, c, grads, NET, False)
    assert ddp.coordination == 0.0
    assert horovod.coordination > 0.0
    assert horovod.total == pytest.approx(c.seconds + horovod.exposed + horovod.coordination)
    # the last gradient waits at most one cycle and one negotiation before it leaves
    negotiation = engines.negotiation_seconds(engines.horovod(), 128, 8, NET)
    assert horovod.coordination <= engines.horovod().cycle + negotiation + 1e-12
    # where the link is not the bottleneck, a longer cycle holds the last gradient longer;
    # where it is, the link's queue absorbs the cycle
    fast = Network(Link(3e-6, 1e-15), Link(40e-6, 1e-15))
    cycles = [simulate(Strategy("horovod", horovod_version=v), layout, c, grads, fast, False)
              for v in ("0.28", "0.20")]
    assert cycles[1].coordination > cycles[0].coordination > 0
    assert cycles[1].coordination <= engines.horovod("0.20").cycle + negotiation + 1e-9


def test_coordination_grows_with_the_machines_when_nothing_else_does():
    grads, c = compute.gradients("resnet18", 32), _compute(0.05)
    latency_only = Network(Link(1e-6, 0.0), Link(1e-4, 0.0))
    parts = [simulate(Strategy("horovod"), costs.Layout(n, 8), c, grads, latency_only, False)
             for n in (16, 128)]
    assert parts[1].coordination > parts[0].coordination


def test_bluefog_posts_after_forward_so_even_its_hierarchical_exchange_overlaps():
    grads, c = compute.gradients("resnet18", 32), _compute(0.2)
    layout = costs.Layout(32, 8)
    ours = simulate(Strategy("hierarchical_neighbor_allreduce"), layout, c, grads, NET, False)
    theirs = simulate(Strategy("bluefog.hierarchical_neighbor_allreduce"), layout, c, grads,
                      NET, False)
    assert ours.exposed > 0 and theirs.exposed == 0.0  # commbench's leaders wait for backward
    assert theirs.overlapped > 0
    # a slow network: Bluefog's fused buffers take longer than backward, and the step shows it
    slow = Network(NET.intra, Link(40e-6, 8 / 0.1e9))
    step = simulate(Strategy("bluefog.neighbor_allreduce"), layout, c, grads, slow, False)
    assert step.exposed > 0 and step.total > c.seconds


def test_bluefogs_atc_posts_each_parameter_from_its_gradient_hook():
    grads, c = compute.gradients("resnet18", 32), _compute(0.2)
    layout = costs.Layout(16, 8)
    slow = Network(NET.intra, Link(40e-6, 8 / 0.5e9))
    awc = simulate(Strategy("bluefog.neighbor_allreduce"), layout, c, grads, slow, False)
    atc = simulate(Strategy("bluefog.neighbor_allreduce", atc=True), layout, c, grads, slow,
                   False)
    assert atc.total >= awc.total  # later posts, the same bytes
    assert atc.overlapped > 0  # and still under backward, unlike commbench's own ATC
    own_atc = simulate(Strategy("neighbor_allreduce", atc=True), layout, c, grads, slow, False)
    assert own_atc.overlapped == 0


def test_bluefogs_negotiation_makes_every_step_wait_for_every_rank():
    grads = compute.gradients("resnet18", 32)
    c = compute.Compute(0.05, 0.1, 0.0, tuple(0.15 + 0.001 * (i % 17) for i in range(200)))
    layout = costs.Layout(64, 8)
    theirs = simulate(Strategy("bluefog.neighbor_allreduce"), layout, c, grads, NET, True)
    ours = simulate(Strategy("neighbor_allreduce"), layout, c, grads, NET, True)
    assert theirs.wait == pytest.approx(c.slowest_of(64)) and ours.wait < theirs.wait


def test_the_table_and_the_projection_file_keep_the_coordination(tmp_path):
    from commbench.simulate import table

    grads = compute.gradients("resnet18", 32)
    c = compute.stated(300.0, 32, grads.forward_share, "stated")
    inputs = Inputs(32, grads, NET, 8, {1: c})
    rows = project([Strategy("horovod")], [1, 64], inputs)
    assert rows[1].step.coordination > 0
    text = table.render("PROJECTION: t", rows, [], "text")
    header = next(line for line in text.splitlines() if line.startswith("strategy"))
    assert "coord ms" in header
    cells = next(line for line in text.splitlines()
                 if line.startswith("horovod") and " 64 " in line)
    assert f"{rows[1].step.coordination * 1e3:.1f}" in cells.split()
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    path = projection_file.write(tmp_path, parser.parse_args([]), "PROJECTION: resnet18, t",
                                 rows, [], inputs, [], {}, {"model": "resnet18"})
    back = projection_file.rows_of(json.loads(path.read_text()))
    assert back[1].step.coordination == pytest.approx(rows[1].step.coordination)
    assert back[1].step.total == pytest.approx(rows[1].step.total)
    # a file written before the coordination part existed reads back with none
    old = json.loads(path.read_text())
    for row in old["rows"]:
        del row["step"]["coordination"]
    assert projection_file.rows_of(old)[1].step == StepTime(
        rows[1].step.compute, rows[1].step.exposed, rows[1].step.overlapped, 0.0,
        rows[1].step.algorithm)
    assert not math.isnan(back[1].img_sec)


# -- which allreduce NCCL runs ---------------------------------------------------------

def test_nccl_runs_the_algorithm_its_own_tuning_model_picks():
    sockets = Network(Link(3.4e-6, 1 / 123e9), Link(42e-6, 8 / 13.5e9))
    sixteen = costs.Layout(128, 8)
    # a fused buffer of Horovod's: the ring, whose steps NCCL rates at 3.4 us inside a
    # machine, against the tree's 28 us a hop (what a 256 KiB chunk takes)
    assert costs.nccl_algorithm(4 * MIB, sixteen, sockets) == "ring"
    assert costs.allreduce(4 * MIB, sixteen, sockets)[1] == "ring"
    # a few bytes: the tree's LL protocol, whose log2(machines) steps win
    assert costs.nccl_algorithm(4096, sixteen, sockets) == "tree"
    # the ring's 2(M-1) steps across machines then cost the link's own latency each
    ring, _ = costs.allreduce(4 * MIB, sixteen, sockets)
    assert ring == pytest.approx(224 * 3.4e-6 + 30 * 42e-6 + 2 * 127 / 128 * 4 * MIB * 8 / 13.5e9)
    # an algorithm asked for alone is the one costed
    assert costs.nccl_algorithm(4096, sixteen, sockets, ("ring",)) == "ring"
    assert costs.allreduce(4 * MIB, sixteen, sockets, ("tree",))[1] == "tree"
