"""`commbench simulate` transports and its answer: a profile (--transport,
--intra-transport) lowers a stated link's rate by its published efficiency and sets
its latency; a bad name is one line; --flow-cap binds only socket transports and a
note says when it does not; the verdict at each N is called only when the bands are
apart and the gap is at least the model's 5%; the chart's title and the table give
that answer first. Fast and without launchers."""

import argparse

import pytest

from cli_helpers import commbench
from commbench.errors import UsageError
from commbench.simulate import answer, costs, table, transports
from commbench.simulate import network_inputs as links
from commbench.simulate.command import add_arguments
from commbench.simulate.project import Row
from commbench.simulate.step import StepTime

RATE = 25e9 / 8  # 25gbit in bytes/s
INTRA = 150e9  # 150GB/s


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _network(*argv):
    return links.network_from(_args(*argv), {})


# -- profiles on stated links -------------------------------------------------------

INTER = [name for name, p in transports.PROFILES.items() if "inter" in p.classes]


@pytest.mark.parametrize("name", INTER)
def test_a_profile_lowers_a_stated_link_by_its_efficiency(name):
    profile = transports.PROFILES[name]
    found = _network("--link", "25gbit", "--transport", name)
    inter = found.network.inter
    assert inter.beta == pytest.approx(1 / (RATE * profile.efficiency))
    assert 1 / inter.beta == pytest.approx(RATE * profile.efficiency)  # e.g. 54% of 25gbit
    low, high = profile.span
    assert inter.beta_ci == pytest.approx((1 / (RATE * low) - 1 / (RATE * high)) / 2)
    # its own latency unless one is stated (line-rate has none: the default 5 us)
    assert inter.alpha == pytest.approx(profile.alpha if profile.alpha is not None else 5e-6)
    assert _network("--link", "25gbit", "--transport", name, "--latency", "7us") \
        .network.inter.alpha == pytest.approx(7e-6)
    assert found.transports["inter"] is profile
    assert found.record()["inter"]["sources"] == list(profile.sources)


def test_socket_transports_are_slower_than_rdma_on_the_same_stated_link():
    socket = _network("--link", "25gbit", "--transport", "nccl-socket").network.inter
    rdma = _network("--link", "25gbit", "--transport", "nccl-ib").network.inter
    line = _network("--link", "25gbit").network.inter
    assert line.beta < rdma.beta < socket.beta
    assert 1 / socket.beta == pytest.approx(0.54 * RATE)  # nccl-tests#83: 1.7 GB/s of 25 Gbit/s
    assert line.source == "stated" and socket.source == "25gbit at nccl-socket's 54%"
    layout = costs.Layout(32, 8)
    nets = [_network("--link", "25gbit", "--transport", t).network
            for t in ("line-rate", "nccl-ib", "nccl-socket")]
    seconds = [costs.allreduce(100e6, layout, n)[0] for n in nets]
    assert seconds == sorted(seconds) and seconds[0] < seconds[-1]


def test_the_intra_profile_lowers_the_intra_link_and_the_default_says_so():
    nvlink = transports.PROFILES["nvlink"]
    stated = _network("--link", "25gbit", "--intra-link", "150GB/s", "--intra-transport",
                      "nvlink").network.intra
    assert stated.beta == pytest.approx(1 / (INTRA * nvlink.efficiency))
    assert stated.alpha == pytest.approx(nvlink.alpha)
    assumed = _network("--link", "25gbit", "--intra-transport", "nvlink").network.intra
    assert assumed.beta == pytest.approx(1 / (INTRA * nvlink.efficiency))
    assert assumed.source == "assumed 150GB/s, NVLink class at nvlink's 82%: pass --intra-link"


def test_line_rate_is_the_default_and_leaves_a_stated_link_as_stated():
    found = _network("--link", "25gbit")
    assert found.transports["inter"].name == transports.LINE_RATE
    assert found.network.inter.beta == pytest.approx(1 / RATE)
    assert found.network.inter.flow_rate == 0
    assert links.describe(found)[0].startswith("transport between machines: line-rate")


# -- bad names ----------------------------------------------------------------------

@pytest.mark.parametrize("argv,message", [
    (["--transport", "carrier-pigeon"],
     "argument --transport: no transport 'carrier-pigeon'; known: line-rate, nccl-ib"),
    (["--transport", "nvlink"],
     "argument --transport: nvlink is not a transport between machines; those are: "
     "line-rate, nccl-ib, nccl-socket, gloo-tcp"),
    (["--intra-transport", "nccl-socket"],
     "argument --intra-transport: nccl-socket is not a transport inside a machine; those "
     "are: line-rate, nvlink"),
    (["--intra-transport", "shared-memory"], "argument --intra-transport: no transport"),
])
def test_a_bad_transport_name_is_one_line(argv, message):
    with pytest.raises(UsageError) as caught:
        _network("--link", "25gbit", *argv)
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_bad_transport_ends_the_command_in_one_line(tmp_path):
    pytest.importorskip("torch.utils.flop_counter", reason="commbench simulate needs torch >= 2.1")
    done = commbench("simulate", "--img-sec", "352", "--model", "resnet18", "--image-size",
                     "32", "--link", "25gbit", "--transport", "nvlink", "--np", "16", "-o",
                     str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1
    assert "argument --transport: nvlink is not a transport between machines" in done.stderr


# -- --flow-cap -----------------------------------------------------------------------

def test_a_flow_cap_binds_a_socket_transport_below_its_efficiency():
    capped = _network("--link", "25gbit", "--transport", "nccl-socket", "--flow-cap", "5gbit")
    inter = capped.network.inter
    profile = transports.PROFILES["nccl-socket"]
    assert inter.flow_rate == pytest.approx(5e9 / 8 * profile.streams)
    assert inter.ring_flows == profile.ring_flows == 2
    # a ring keeps 2 flows across the NIC: 10 Gbit/s, below 54% of 25 Gbit/s (13.5)
    assert 1 / inter.beta_at(100e6, inter.ring_flows) == pytest.approx(2 * 5e9 / 8)
    assert 1 / inter.beta_at(100e6, 8) == pytest.approx(0.54 * RATE)  # enough flows: the rate
    free = _network("--link", "25gbit", "--transport", "nccl-socket").network
    layout = costs.Layout(32, 8)
    assert costs.allreduce(100e6, layout, capped.network)[0] > \
        costs.allreduce(100e6, layout, free)[0]
    assert not any("--flow-cap" in note for note in capped.notes)
    # gloo keeps one pair per peer: the cap alone is its rate
    gloo = _network("--link", "25gbit", "--transport", "gloo-tcp", "--flow-cap", "5gbit")
    assert 1 / gloo.network.inter.beta_at(100e6, gloo.network.inter.ring_flows) == \
        pytest.approx(5e9 / 8)


@pytest.mark.parametrize("name", ["nccl-ib", "line-rate"])
def test_a_flow_cap_does_not_bind_rdma_or_the_line_rate_and_a_note_says_so(name):
    capped = _network("--link", "25gbit", "--transport", name, "--flow-cap", "5gbit")
    free = _network("--link", "25gbit", "--transport", name)
    assert capped.network.inter.flow_rate == 0
    assert capped.network.inter.beta_at(100e6) == free.network.inter.beta_at(100e6)
    assert f"--flow-cap not applied: {name} is not capped per flow" in capped.notes
    assert f"--flow-cap not applied: {name} is not capped per flow" in links.describe(capped)


def test_a_bad_flow_cap_is_one_line():
    with pytest.raises(UsageError, match="^argument --flow-cap") as caught:
        _network("--link", "25gbit", "--transport", "nccl-socket", "--flow-cap", "lots")
    assert "\n" not in str(caught.value)


# -- the answer ---------------------------------------------------------------------

def _row(strategy, workers, img_sec, low=None, high=None):
    step = StepTime(0.1, 0.0, 0.0, 0.0)
    return Row(strategy, workers, max(workers // 8, 1), img_sec,
               img_sec if low is None else low, img_sec if high is None else high,
               0.9, step, None, None, "unvalidated")


def test_a_clear_gap_with_apart_bands_is_called():
    (v,) = answer.verdicts([_row("allreduce", 16, 800, 760, 840),
                            _row("neighbor_allreduce (exponential-2, dynamic)", 16, 1000,
                                 950, 1050)])
    assert v.called and v.call() == "called"
    assert v.fastest.strategy.startswith("neighbor_allreduce") and v.ratio == pytest.approx(1.25)
    assert answer.runs_of([v]) == "N=16 neighbor_allreduce 1.25x"
    assert v.sentence() == "neighbor_allreduce (exponential-2, dynamic), 1.25x allreduce"


def test_overlapping_bands_are_too_close_to_call_even_with_a_large_gap():
    (v,) = answer.verdicts([_row("a", 16, 1000, 800, 1200), _row("b", 16, 900, 850, 950)])
    assert v.ratio == pytest.approx(1000 / 900) and v.ratio > 1 + answer.RESOLUTION
    assert not v.called
    assert v.call() == "too close to call (bands overlap)"
    assert answer.runs_of([v]) == "N=16 too close to call"
    assert v.sentence() == "too close to call: a 1.11x b (bands overlap)"


def test_a_gap_below_the_models_own_5_percent_is_too_close_to_call():
    (v,) = answer.verdicts([_row("a", 32, 1000), _row("b", 32, 970)])  # bands apart
    assert v.fastest.low > v.runner_up.high and not v.called
    assert v.call() == "too close to call (within 5%)"
    assert "within 5%" in v.sentence()
    (v,) = answer.verdicts([_row("a", 32, 1060), _row("b", 32, 1000)])
    assert v.called


def test_the_charts_line_puts_worker_counts_with_the_same_call_together():
    rows = [_row("a", n, 1000) for n in (1, 2, 4, 8, 16, 32, 64)]
    rows += [_row("b", n, 990) for n in (1, 2, 4, 8)]  # within 5%: too close
    rows += [_row("b (ring)", n, 1000 / r) for n, r in ((16, 1.20), (32, 1.25), (64, 1.25))]
    assert answer.runs_of(answer.verdicts(rows)) == "N=1-8 too close to call; N=16-64 a 1.20-1.25x"
    assert answer.runs_of(answer.verdicts([_row("a", 16, 1000)])) == ""  # one strategy


def test_one_verdict_per_worker_count_in_order_and_a_lone_strategy_is_called():
    rows = [_row("a", 64, 50), _row("b", 64, 100), _row("a", 16, 30), _row("b", 16, 20),
            _row("c", 16, 10)]
    verdicts = answer.verdicts(rows)
    assert [v.workers for v in verdicts] == [16, 64]
    assert [(v.fastest.strategy, v.runner_up.strategy) for v in verdicts] == \
        [("a", "b"), ("b", "a")]
    (alone,) = answer.verdicts([_row("a", 8, 10)])
    assert alone.runner_up is None and alone.called and alone.ratio is None
    assert alone.sentence() == "a (the only strategy projected)"


def test_the_table_gives_the_answer_first():
    rows = [_row("a", 16, 1000), _row("b", 16, 800), _row("a", 32, 1000), _row("b", 32, 990)]
    text = table.render("PROJECTION: test", rows, [], "text")
    head = text.split("\n\n")[1]
    assert head.splitlines()[0].split()[:3] == ["N", "fastest", "(projected)"]
    assert "called" in head.splitlines()[2] and "too close to call (within 5%)" in head


def test_the_chart_title_says_the_fastest_projected():
    pytest.importorskip("matplotlib")
    from commbench.plots import projection

    rows = [_row("allreduce", 16, 800, 760, 840), _row("neighbor_allreduce", 16, 1000, 950, 1050),
            _row("allreduce", 32, 1600, 1500, 1700), _row("neighbor_allreduce", 32, 1620,
                                                          1550, 1690)]
    title = projection.figure("PROJECTION: resnet50", rows).get_suptitle()
    assert title == ("PROJECTION: resnet50\nfastest (projected): N=16 neighbor_allreduce "
                     "1.25x; N=32 too close to call")
    lone = projection.figure("PROJECTION: resnet50", [_row("allreduce", 16, 800)])
    assert lone.get_suptitle() == "PROJECTION: resnet50"  # nothing to compare


def test_two_too_close_to_call_but_both_ahead_of_the_rest_say_so():
    rows = [_row("a (ring)", n, 1000, 950, 1050) for n in (16, 32)]
    rows += [_row("b", n, 990, 940, 1040) for n in (16, 32)]
    rows += [_row("c", 16, 600, 550, 650), _row("c", 32, 500, 450, 550)]
    v16, v32 = answer.verdicts(rows)
    assert not v16.called and v16.both_ahead and v16.third.strategy == "c"
    assert v16.call() == "too close to call (bands overlap); both 1.65x c or more"
    assert v16.sentence() == ("too close to call: a (ring) 1.01x b (bands overlap); both ahead "
                              "of c, 1.65x or more")
    assert answer.runs_of([v16, v32]) == \
        "N=16-32 a or b (too close to call), both 1.65-1.98x c or more"
    # the leaders swapping places from one N to the next is still the same answer
    swapped = [_row("a (ring)", 64, 980, 930, 1030), _row("b", 64, 1000, 950, 1050),
               _row("c", 64, 500, 450, 550)]
    assert answer.runs_of(answer.verdicts(rows + swapped)).startswith("N=16-64 a or b")
    # no claim about the rest where any of the rest is within reach of either leader
    for others in ([_row("c", 8, 960, 900, 1000)],  # of the second
                   [_row("c", 8, 900, 850, 940)],  # of the first, whose band is wide
                   [_row("c", 8, 600, 550, 650), _row("d", 8, 590, 400, 1100)]):  # a fourth
        (v,) = answer.verdicts([_row("a", 8, 1000, 500, 1500), _row("b", 8, 990, 960, 1020),
                                *others])
        assert not v.both_ahead and answer.runs_of([v]) == "N=8 too close to call"
        assert "ahead" not in v.sentence() and "or more" not in v.call()
    # names that would read alike without their settings keep them
    (v,) = answer.verdicts([_row("a (ring)", 8, 1000, 950, 1050),
                            _row("a (exponential-2)", 8, 990, 940, 1040),
                            _row("c", 8, 500, 450, 550)])
    assert answer.runs_of([v]) == \
        "N=8 a (exponential-2) or a (ring) (too close to call), both 1.98x c or more"
