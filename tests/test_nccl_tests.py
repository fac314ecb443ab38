"""`commbench simulate --nccl-tests`: reading nccl-tests output (every file of
tests/data/nccl-tests, mpirun's --tag-output prefixes, one-line errors for bad input),
the issue's target (a projection whose link figures match a two-machine file within
5% at every size it measured, costed as the projection costs it), and the command end
to end. Fast and without launchers: no test here starts a job."""

import argparse
import json
from pathlib import Path

import pytest

from cli_helpers import commbench
from commbench import units
from commbench.errors import UsageError
from commbench.simulate import costs, nccl_tests, nccl_tests_output
from commbench.simulate import network_inputs as links
from commbench.simulate.command import add_arguments

DATA = Path(__file__).parent / "data" / "nccl-tests"
H100 = DATA / "all_reduce_perf-h100-2x8.txt"
EFA = DATA / "all_reduce_perf-efa-t4-2x1.txt"
ALLTOALL = DATA / "alltoall_perf-rtx6000d-2x8.txt"
V100 = DATA / "all_reduce_perf-v100-tcp100g-excerpt.txt"
SENDRECV = DATA / "sendrecv_perf-a100-1x8.txt"
TWO_MACHINES = [EFA, H100, ALLTOALL]
TARGET = 0.05  # the issue's: within 5% at every size measured

# What each file holds, read off the file by hand: op, ranks, machines, rows (sizes 0
# are nccl-tests' empty operation and skipped), first and last (size, mean of the
# out-of-place and in-place times in us), and the closing "# Avg bus bandwidth".
EXPECTED = {
    EFA.name: ("all_reduce", 2, 2, 29, (4, (65.70 + 64.84) / 2),
               (1073741824, (344981 + 344454) / 2), 1.15327),
    H100.name: ("all_reduce", 16, 2, 31, (8, (135.8 + 123.5) / 2),
                (8589934592, (47535 + 47743) / 2), 70.742),
    # no '# Rank' lines: 32 ranks from busbw/algbw; one process per machine is the
    # parser's stated assumption (the thread, NVIDIA/nccl#450, ran 4 x 8)
    V100.name: ("all_reduce", 32, 32, 5, (8388608, (3597.6 + 3955.7) / 2),
                (134217728, (185182 + 213259) / 2), 2.68429),
    ALLTOALL.name: ("alltoall", 16, 2, 24, (1024, (55.66 + 29.21) / 2),
                    (8589934592, (224292 + 211843) / 2), 9.04853),
    # -g 8 in one process and no '# Rank' lines: one machine of 8
    SENDRECV.name: ("sendrecv", 8, 1, 4, (134217728, (1211.2 + 1211.8) / 2),
                    (1073741824, (5503.4 + 5490.5) / 2), None),
}


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def _table(ranks_hosts, rows, op="all_reduce", wrong="0"):
    """A small nccl-tests output: '# Rank' lines, the header, rows of (size, us)."""
    lines = [f"# Collective test starting: {op}_perf",
             "# nThread 1 nGpus 1 minBytes 8 maxBytes 1024 step: 2(factor) warmup iters: 5",
             "#", "# Using devices"]
    lines += [f"#  Rank {r:2d} Group  0 Pid {1000 + r:6d} on {host} device  {r % 8} [0x00] GPU"
              for r, host in enumerate(ranks_hosts)]
    lines += ["#", "#       size         count      type   redop    root     time   algbw   "
                   "busbw #wrong     time   algbw   busbw #wrong",
              "#        (B)    (elements)                               (us)  (GB/s)  "
              "(GB/s)            (us)  (GB/s)  (GB/s)"]
    for size, us in rows:
        lines.append(f"{size:12d} {size // 4:13d}     float     sum      -1 {us:8.2f}   0.00   "
                     f"0.00 {wrong:>6}  {us:8.2f}   0.00   0.00      0")
    lines.append("# Avg bus bandwidth    : 1.0 ")
    return "\n".join(lines) + "\n"


# -- reading ---------------------------------------------------------------------------

@pytest.mark.parametrize("path", sorted(DATA.glob("*.txt")), ids=lambda p: p.name)
def test_every_file_is_read(path):
    op, ranks, machines, count, first, last, avg = EXPECTED[path.name]
    f = nccl_tests_output.parse(str(path))
    assert (f.op, f.ranks, f.machines, len(f.rows)) == (op, ranks, machines, count)
    assert (f.rows[0].size, f.rows[0].seconds * 1e6) == pytest.approx(first)
    assert (f.rows[-1].size, f.rows[-1].seconds * 1e6) == pytest.approx(last)
    assert f.avg_busbw == avg
    sizes = [r.size for r in f.rows]
    assert sizes == sorted(sizes) and all(s > 0 for s in sizes)
    assert f.link_class == ("inter" if machines > 1 else "intra")
    if f.hosts:  # the '# Rank' lines, in rank order
        assert len(f.hosts) == ranks and len(set(f.hosts)) == machines


def test_the_printed_bus_bandwidth_is_kept_and_agrees_with_nccl_tests_factor():
    # busbw = size / time x 2(n-1)/n for allreduce: the parser's factor is nccl-tests'
    f = nccl_tests_output.parse(str(H100))
    row = f.rows[-1]
    assert row.busbw == pytest.approx((338.82 + 337.35) / 2)
    assert row.size / row.seconds / 1e9 * f.bus_factor() == pytest.approx(row.busbw, rel=0.01)


def test_mpirun_tag_output_prefixes_are_skipped(tmp_path):
    tagged = tmp_path / "all_reduce_perf-tagged.txt"
    tagged.write_text("".join(f"[1,{i % 16}]<stdout>:{line}\n"
                              for i, line in enumerate(H100.read_text().splitlines())))
    plain, read = nccl_tests_output.parse(str(H100)), nccl_tests_output.parse(str(tagged))
    assert (read.op, read.ranks, read.machines, read.hosts) == \
        (plain.op, plain.ranks, plain.machines, plain.hosts)
    assert [(r.size, r.seconds, r.busbw) for r in read.rows] == \
        [(r.size, r.seconds, r.busbw) for r in plain.rows]
    assert read.avg_busbw == plain.avg_busbw
    # NCCL INFO lines between the header and the rows (the EFA file has them) too
    assert len(nccl_tests_output.parse(str(EFA)).rows) == 29


# -- bad input: one line that names the file -----------------------------------------

def _bad(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("name,text,message", [
    ("all_reduce_perf-empty.txt", "# nThread 1 nGpus 1\nno table here\n",
     "no nccl-tests table"),
    ("all_reduce_perf-wrong.txt",
     _table(["a"] * 4 + ["b"] * 4, [(8, 30.0), (1024, 31.0), (1 << 20, 60.0)], wrong="5"),
     "#wrong is 5"),
    ("reduce_scatter_perf-2x8.txt",
     _table(["a"] * 2 + ["b"] * 2, [(8, 30.0), (1024, 31.0)], op="reduce_scatter"),
     "reduce_scatter_perf is not read"),
    ("all_reduce_perf-one.txt", _table(["a"], [(8, 5.0), (1024, 6.0), (1 << 20, 20.0)]),
     "one rank moves nothing"),
    ("all_reduce_perf-uneven.txt", _table(["a", "a", "a", "b"], [(8, 5.0), (1024, 6.0)]),
     "spread unevenly"),
    ("notes.txt", "just some words\n", "cannot tell which nccl-tests test printed it"),
])
def test_bad_input_is_one_line_naming_the_file(tmp_path, name, text, message):
    path = _bad(tmp_path, name, text)
    with pytest.raises(UsageError) as caught:
        nccl_tests_output.parse(str(path))
    error = str(caught.value)
    assert message in error and str(path) in error and "\n" not in error


def test_a_missing_file_is_one_line_naming_it(tmp_path):
    missing = tmp_path / "all_reduce_perf-nowhere.txt"
    with pytest.raises(UsageError) as caught:
        nccl_tests.links([str(missing)], 1e-6)
    error = str(caught.value)
    assert error.startswith("argument --nccl-tests: cannot read") and str(missing) in error
    assert "\n" not in error


def test_too_few_sizes_to_fit_is_one_line(tmp_path):
    path = _bad(tmp_path, "all_reduce_perf-two.txt",
                _table(["a", "b"], [(1 << 20, 100.0), (1 << 21, 180.0)]))
    with pytest.raises(UsageError, match="at least 3 sizes") as caught:
        nccl_tests.links([str(path)], 1e-6)
    assert "all_reduce_perf-two.txt" in str(caught.value)


# -- the target: the projection's links give a two-machine file back ---------

def _projected_times(f, net, algorithms=("ring", "tree")):
    """Seconds of every row of f as the projection costs it, on the network the command
    builds (links.network_from): commbench.simulate.costs at the file's own layout."""
    g = f.ranks // f.machines
    out = []
    for row in f.rows:
        if f.op == "all_reduce":
            out.append(costs.allreduce(row.size, costs.Layout(f.ranks, g), net, algorithms)[0])
        else:  # alltoall: every message at once through the NIC (nccl_tests.point)
            messages, nbytes, _, size = nccl_tests.point(f, row, net.intra.alpha)
            out.append(net.for_exchange().inter.seconds(nbytes, messages, size))
    return out


@pytest.mark.parametrize("path", TWO_MACHINES, ids=lambda p: p.name)
def test_a_two_machine_file_is_given_back_within_5_percent_at_every_size(path):
    f = nccl_tests_output.parse(str(path))
    fitted, _ = nccl_tests.links([str(path)], 1e-6)
    (link,) = fitted.values()
    errors = [e for _, e in nccl_tests.reproduced(f, link, 1e-6)]
    assert len(errors) == len(f.rows)
    assert max(abs(e) for e in errors) <= TARGET, errors
    # and through the network the command builds from the flag, as a projection runs
    net = links.network_from(_args("--nccl-tests", str(path)), {}).network
    projected = _projected_times(f, net)
    worst = max(abs(t / r.seconds - 1) for t, r in zip(projected, f.rows))
    assert worst <= TARGET, [(r.size, t / r.seconds - 1) for t, r in zip(projected, f.rows)]


def test_where_the_tree_wins_the_projection_still_gives_the_file_back():
    """On 2 x 8 NCCL's tuning model (costs.nccl_algorithm) runs the tree up to 32 KiB and
    the ring above; the tree has 14 fewer latency steps inside machines than the ring
    the fit assumes, which ran 11% faster than the file before β was solved for the
    algorithm the projection runs."""
    f = nccl_tests_output.parse(str(H100))
    net = links.network_from(_args("--nccl-tests", str(H100)), {}).network
    layout = costs.Layout(16, 8)
    small = [r for r in f.rows if r.size <= 32768]
    assert {costs.allreduce(r.size, layout, net)[1] for r in small} == {"tree"}
    assert {costs.allreduce(r.size, layout, net)[1] for r in f.rows if r.size >= 65536} \
        == {"ring"}
    for row in small:
        assert costs.allreduce(row.size, layout, net)[0] == pytest.approx(row.seconds, rel=1e-6)
    # the ring alone never runs faster than what NCCL measured (its own best choice)
    ring = nccl_tests.reproduced(f, net.inter, net.intra.alpha, ("ring",))
    assert min(e for _, e in ring) >= -1e-9


def test_the_curve_is_what_matches_the_file_not_the_plain_fit():
    f = nccl_tests_output.parse(str(H100))
    fitted, _ = nccl_tests.links([str(H100)], 1e-6)
    (link,) = fitted.values()
    assert len(link.curve) == len(f.rows)
    plain = [e for _, e in nccl_tests.reproduced(f, nccl_tests.without_curve(link), 1e-6)]
    assert max(abs(e) for e in plain) > TARGET  # NCCL's protocols bend the line
    assert link.source == "nccl-tests all_reduce_perf-h100-2x8.txt"
    assert 0 < link.alpha < min(r.seconds for r in f.rows) and link.beta > 0


def test_an_intra_file_sets_the_latency_the_inter_fit_takes_off(tmp_path):
    """The projection's allreduce inside machines runs on the intra link it picks (a
    sendrecv file's when no allreduce one is given); the inter fit must take off those
    same steps, or the projection misses the two-machine file by their sum (17% at
    3.5 us a step when the fit took off 1 us instead)."""
    intra = _bad(tmp_path, "sendrecv_perf-1x8.txt", _table(
        ["a"] * 8, [(s, 3.5 + s / 150e3) for s in (8, 1024, 65536, 1 << 20, 1 << 24)],
        op="sendrecv"))
    args = _args("--nccl-tests", f"{intra},{H100}")
    found = links.network_from(args, {})
    net = found.network
    assert net.intra.source == "nccl-tests sendrecv_perf-1x8.txt"
    assert net.intra.alpha == pytest.approx(3.5e-6, rel=0.05)
    f = nccl_tests_output.parse(str(H100))
    projected = _projected_times(f, net)
    worst = max(abs(t / r.seconds - 1) for t, r in zip(projected, f.rows))
    assert worst <= TARGET
    assert len([n for n in found.notes if n.startswith("nccl-tests ")]) == 2


def test_an_intra_latency_the_two_machine_times_cannot_hold_is_one_line():
    # the sendrecv example starts at 128 MB: its fitted latency (~509 us) is no latency
    with pytest.raises(UsageError) as caught:
        nccl_tests.links([str(SENDRECV), str(H100)], 1e-6)
    error = str(caught.value)
    assert "all_reduce_perf-h100-2x8.txt" in error and "sendrecv_perf-a100-1x8.txt" in error
    assert "\n" not in error
    with pytest.raises(UsageError, match="state a smaller --intra-latency"):
        nccl_tests.links([str(H100)], 200e-6)


# -- the command end to end ---------------------------------------------------------

# a small model: the command builds it (on torch's meta device) before it reads links
COMPUTE = ["--img-sec", "352", "--model", "resnet18", "--image-size", "32", "--batch-size",
           "32"]


def _simulate(*args):
    return commbench("simulate", *args)


def test_a_fitted_link_prints_the_per_size_figures_the_projection_uses():
    fitted, _ = nccl_tests.links([str(H100)], 1e-6)
    (link,) = fitted.values()
    line = link.describe()
    (smallest, _), (largest, beta) = link.curve[0], link.curve[-1]
    assert "per size as measured, " in line
    assert f"at {units.format_bytes(smallest)} to " in line
    assert f"{1 / beta / 1e9:.3g} GB/s at {units.format_bytes(largest)}," in line


def test_the_command_fits_its_links_on_the_file_and_records_them(tmp_path):
    pytest.importorskip("torch.utils.flop_counter", reason="commbench simulate needs torch >= 2.1")
    done = _simulate("--nccl-tests", str(H100), "--transport", "nccl-socket", "--flow-cap",
                     "5gbit", *COMPUTE, "--np", "16,32", "-o", str(tmp_path))
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert ("nccl-tests all_reduce_perf-h100-2x8.txt: all_reduce_perf, 16 ranks on 2 "
            "machines, Avg bus bandwidth 70.742 GB/s.") in out
    assert "between machines" in out and "(nccl-tests all_reduce_perf-h100-2x8.txt)" in out
    # a fitted link measured its transport: the profile and the cap are not applied
    assert "transport nccl-socket not applied between machines: its link was fitted from " \
           "files, which measured their transport." in out
    assert "--flow-cap not applied: the link between machines was fitted, not stated." in out
    (written,) = tmp_path.glob("*.json")
    doc = json.loads(written.read_text())
    assert doc["kind"] == "projection" and doc["config"]["nccl_tests"] == str(H100)
    inputs = doc["inputs"]
    assert set(inputs["transports"]) == {"inter", "intra"}
    assert inputs["transports"]["inter"]["name"] == "nccl-socket"
    assert inputs["transports"]["intra"]["name"] == "line-rate"
    inter = inputs["links"]["inter"]
    assert inter["source"] == "nccl-tests all_reduce_perf-h100-2x8.txt"
    assert len(inter["curve"]) == 31 and inter["flow_rate"] == 0  # β at every size measured
    assert inputs["links"]["intra"]["source"].startswith("assumed 150GB/s")


def test_a_bad_file_ends_the_command_in_one_line(tmp_path):
    name, message = "reduce_scatter_perf-x.txt", "reduce_scatter_perf is not read"
    path = _bad(tmp_path, name, _table(["a", "b"], [(8, 30.0)], op="reduce_scatter"))
    done = _simulate("--nccl-tests", str(path), *COMPUTE, "--np", "16", "-o",
                     str(tmp_path / "out"))
    assert done.returncode != 0
    assert done.stderr.count("\n") == 1 and message in done.stderr and name in done.stderr, \
        done.stderr
    assert not list((tmp_path / "out").glob("*.json"))


def test_a_missing_file_ends_the_command_in_one_line(tmp_path):
    done = _simulate("--nccl-tests", str(tmp_path / "nowhere.txt"), *COMPUTE, "--np", "16",
                     "-o", str(tmp_path / "out"))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "nowhere.txt" in done.stderr, done.stderr
