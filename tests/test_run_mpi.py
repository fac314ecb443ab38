"""`python -m commbench` end to end through real launchers (mpiexec, torchrun)."""

import time

import numpy as np
import pytest

from launchers import PYTHON, TINY_RUN, mpiexec, only_result, run, torchrun
from programs.check_strategies import CHECKS_TIMEOUT, assert_strategy_clean

pytestmark = pytest.mark.mpi


def check_consistent(doc, workers, strategy):
    samples, summary = doc["samples"], doc["summary"]
    assert doc["environment"]["world_size"] == workers == summary["workers"]
    assert doc["strategy"]["name"] == strategy == doc["config"]["dist_optimizer"]
    seconds = np.array(samples["iteration_seconds"])
    assert seconds.shape == (workers, 3)  # every rank's samples, not rank 0's times N
    assert np.array(samples["batch_seconds"]).shape == (workers, 3, 2)
    images = doc["config"]["batch_size"] * doc["config"]["num_batches_per_iter"]
    totals = (images / seconds).sum(axis=0)
    assert summary["total_img_sec"]["mean"] == pytest.approx(totals.mean())
    assert summary["img_sec_per_worker"]["mean"] == pytest.approx(totals.mean() / workers)
    assert 0 < summary["latency_seconds_per_batch"]["p50"] <= summary[
        "latency_seconds_per_batch"]["p90"]


def check_ring_bytes(doc, workers):
    """Every rank sends the ring's 2(N-1)/N of the gradients' bytes per step, plus its
    chunks' padding (under 2(N-1) bytes per bucket); rank 0 also broadcasts the
    BatchNorm buffers to the N-1 others."""
    import torchvision

    model = torchvision.models.resnet18()
    gradients = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    ring, hops = 2 * (workers - 1) * gradients / workers, 2 * (workers - 1)
    sent, messages = doc["samples"]["sent_bytes"], doc["samples"]["sent_messages"]
    assert np.array(sent).shape == (workers, 6)  # TINY_RUN: 6 measured steps
    for rank, (steps, counts) in enumerate(zip(sent, messages)):
        broadcast = (workers - 1) * buffers if rank == 0 else 0
        buckets = (counts[0] - (workers - 1 if rank == 0 else 0)) / hops
        assert buckets >= 1 and all(c == counts[0] for c in counts)
        for nbytes in steps:
            assert ring <= nbytes - broadcast <= ring + hops * buckets, (rank, nbytes)
    wire = doc["summary"]["wire"]
    assert wire["communicating_steps"] == 1
    assert wire["bytes_per_image"] == wire["bytes_per_step"] / doc["config"]["batch_size"]
    assert "step_split_by_steps" not in doc["summary"]


@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("strategy", ["allreduce", "none"])
def test_mpiexec_run_writes_a_consistent_result(tmp_path, workers, strategy):
    done = mpiexec(workers, ["-m", "commbench", f"--dist-optimizer={strategy}",
                             "--results-dir", str(tmp_path), *TINY_RUN], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    check_consistent(doc, workers, strategy)
    assert doc["environment"]["launcher"] == "openmpi"
    assert doc["environment"]["mpi_library"].startswith("Open MPI")
    # Only rank 0 prints: one header, one line per iteration.
    assert done.stdout.count("Model: resnet18") == 1
    assert done.stdout.count("Iter #") == 3
    assert f"Total img/sec on {workers} worker(s)" in done.stdout
    if strategy == "allreduce":
        # Checked, not assumed: every rank ends with bit-identical parameters.
        assert len(set(doc["samples"]["parameter_digests"])) == 1
        assert doc["summary"]["parameters_identical"] is True
        assert 0 < doc["summary"]["efficiency_in_job"]
        # On the CPU under mpiexec, DDP's buckets go through MPI (--cpu-transport auto).
        assert doc["strategy"]["transport"] == "mpi"
        assert ("(CPU tensors move over mpi: --cpu-transport auto under an MPI launcher)"
                in done.stdout)
        check_ring_bytes(doc, workers)
    else:
        # Without communication, workers fed different data drift apart.
        assert doc["summary"]["parameters_identical"] is False
        assert doc["summary"]["final_consensus_distance"] > 0
        assert doc["summary"]["wire"]["bytes_per_step"] == 0


@pytest.mark.timeout(CHECKS_TIMEOUT)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_allreduce_averages_gradients_on_both_transports(n):
    """DDP on gloo (fp32 and fp16) and with its MPI averager: after one step every
    gradient is the mean of the workers' (tests/programs/check_strategies.py)."""
    assert_strategy_clean(n, "allreduce")


def test_torchrun_run_writes_a_consistent_result(tmp_path):
    done = torchrun(2, ["-m", "commbench", "--dist-optimizer=allreduce",
                        "--results-dir", str(tmp_path), *TINY_RUN], timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    check_consistent(doc, 2, "allreduce")
    assert doc["environment"]["launcher"] == "torchrun"
    assert doc["summary"]["parameters_identical"] is True


def test_plain_single_process_is_one_worker(tmp_path):
    done = run([PYTHON, "-m", "commbench", "--results-dir", str(tmp_path), *TINY_RUN],
               timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = only_result(tmp_path)
    check_consistent(doc, 1, "allreduce")
    assert doc["environment"]["launcher"] == "single"


def test_unknown_strategy_under_mpiexec_fails_fast_on_every_rank(tmp_path):
    start = time.monotonic()
    done = mpiexec(2, ["-m", "commbench", "--dist-optimizer=nope",
                       "--results-dir", str(tmp_path), *TINY_RUN], timeout=60)
    assert done.returncode != 0
    assert time.monotonic() - start < 30
    errors = [line for line in done.stderr.splitlines() if line.startswith("commbench: error:")]
    # Each rank says it; a rank slower to start may be killed by mpiexec before it can.
    assert 1 <= len(errors) <= 2 and all("unknown strategy 'nope'" in e for e in errors)
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.json"))


def test_ranks_started_with_different_flags_are_refused(tmp_path):
    args = ["-m", "commbench", "--results-dir", str(tmp_path), *TINY_RUN]
    mpmd = args + ["--batch-size", "4", ":", "-n", "1", PYTHON] + args
    start = time.monotonic()
    done = mpiexec(1, mpmd, timeout=120)
    assert done.returncode != 0
    assert time.monotonic() - start < 60
    assert "ranks were started with different configurations" in done.stderr
    assert "--batch-size" in done.stderr and "Traceback" not in done.stderr
    assert not list(tmp_path.glob("*.json"))
