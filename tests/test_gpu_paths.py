"""The GPU paths, checked on the CPU: torch.cuda is patched to pretend GPUs exist and
calls are recorded, so the order of set_device and collectives, the one-rank-per-GPU
check, the device sync in microbench's timed region, the exchange's message count on
NCCL, subgroup timeouts, CUDA errors and the recorded GPU facts are proven without a
GPU. (tests/test_gpu.py runs the real thing where GPUs exist.)"""

import os
import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from commbench.errors import UsageError
from commbench.launch import distributed, gpus, groups
from commbench.launch.detect import LaunchInfo, detect_launch


@pytest.fixture
def events():
    return []


@pytest.fixture
def fake_gpus(monkeypatch, events):
    """Two pretend GPUs; set_device, group creation and gathers are recorded, and the
    "nccl" process group is really gloo (world size 1)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: events.append(("set_device", i)))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "Pretend GPU")
    init, new_group, gather = dist.init_process_group, dist.new_group, dist.all_gather_object

    def init_process_group(**kw):
        events.append(("init", kw["backend"], kw["timeout"]))
        init(**{**kw, "backend": "gloo"})

    def record_new_group(*args, **kw):
        events.append(("new_group", kw.get("backend"), kw.get("timeout")))
        return new_group(*args, **kw)

    def all_gather_object(out, obj, group=None):
        events.append(("gather", "default group" if group is None else "subgroup"))
        return gather(out, obj, group=group)

    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    monkeypatch.setattr(dist, "new_group", record_new_group)
    monkeypatch.setattr(dist, "all_gather_object", all_gather_object)
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        monkeypatch.delenv(name, raising=False)
    yield
    distributed.leave_libraries()


def test_with_the_local_rank_known_the_gpu_is_set_before_the_process_group(fake_gpus, events):
    ctx = distributed.init_distributed(LaunchInfo("torchrun", 0, 1, 1, 2, 0), False, 7)
    assert events[0] == ("set_device", 1)
    assert events[1] == ("init", "nccl", timedelta(seconds=7))
    assert ctx.backend == "nccl" and ctx.device == torch.device("cuda", 1)


@pytest.mark.parametrize("launch", [
    LaunchInfo("mpich", 0, 1),  # srun --mpi=pmi2 without SLURM_LOCALID, Hydra without locals
    LaunchInfo("slurm", 0, 1, None, None, 0),
])
def test_without_it_the_gpu_is_set_from_the_hostnames_before_any_nccl_operation(
        fake_gpus, events, launch):
    ctx = distributed.init_distributed(launch, False, 7)
    kinds = [e[0] for e in events]
    first_set = kinds.index("set_device")
    assert "set_device" not in kinds[:kinds.index("init")]
    # Before the GPU is chosen: a gloo subgroup with the job's timeout, and gathers on it
    # only; nothing on the default (NCCL) group.
    assert events[kinds.index("new_group")] == ("new_group", "gloo", timedelta(seconds=7))
    assert ("gather", "default group") not in events[:first_set]
    assert ("gather", "subgroup") in events[:first_set]
    assert ctx.device == torch.device("cuda", 0) and ctx.gpu_names == ("Pretend GPU",)
    # the spelling this torch reads, only (torch >= 2.2 warns on every rank of the other)
    spellings = ["TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"]
    read, other = spellings[::-1] if gpus.torch_older_than(2, 2) else spellings
    assert os.environ[read] == "1" and other not in os.environ


def test_older_torch_gets_the_older_spelling_of_nccl_error_handling(monkeypatch):
    for name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(torch, "__version__", "2.1.2+cu121")
    gpus.nccl_errors_end_the_job()
    assert os.environ["NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in os.environ


@pytest.mark.parametrize("environ, local_rank", [
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_LOCALID": "1"}, 1),  # srun --mpi=pmi2
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "PMI_LOCAL_RANK": "1"}, 1),  # Cray MPICH
    ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0"}, 0),  # Hydra
])
def test_every_launcher_that_knows_the_local_rank_is_read(environ, local_rank):
    assert detect_launch(environ).local_rank == local_rank


HOSTS = ["a", "a", "b", "b"]


@pytest.mark.parametrize("claims, ok", [
    ([(None, 0, "G"), (None, 1, "G"), (None, 0, "G"), (None, 1, "G")], True),
    # each rank sees only its own GPU (srun --gpus-per-task=1): all index 0, distinct sets
    ([("0", 0, "G"), ("1", 0, "G"), ("0", 0, "G"), ("1", 0, "G")], True),
    # machine b: two ranks on its one GPU
    ([(None, 0, "G"), (None, 1, "G"), (None, 0, "G"), (None, 0, "G")], False),
    # machine a: a local rank beyond its GPUs
    ([(None, 0, "G"), (None, 2, None), (None, 0, "G"), (None, 1, "G")], False),
])
def test_more_ranks_than_gpus_on_a_machine_is_a_clear_error(claims, ok):
    if ok:
        gpus.check_one_gpu_each(HOSTS, claims)
        return
    with pytest.raises(UsageError, match="runs 2 ranks but they have only 1 GPU"):
        gpus.check_one_gpu_each(HOSTS, claims)


@pytest.fixture
def one_rank():
    """A real gloo process group of one rank, as init_distributed makes it on the CPU."""
    ctx = distributed.init_distributed(LaunchInfo("single", 0, 1, 0, 1, 0), True, 9)
    yield ctx
    distributed.leave_libraries()


def test_subgroups_get_the_jobs_timeout_and_are_made_once(one_rank, monkeypatch):
    made = []
    new_group = dist.new_group
    monkeypatch.setattr(dist, "new_group",
                        lambda *a, **kw: made.append(kw.get("timeout")) or new_group(*a, **kw))
    first = groups.machine_groups(1, 1)
    assert groups.machine_groups(1, 1) is first
    assert made == [timedelta(seconds=9)]


def test_microbench_stops_the_clock_after_a_device_sync(one_rank, monkeypatch):
    from commbench import loop
    from commbench.microbench import harness

    order = []

    def slow_sync():
        time.sleep(0.05)  # a GPU still working after the call returned
        order.append("sync")

    monkeypatch.setattr(loop, "device_sync", lambda device: slow_sync)
    contender = harness.Contender("commbench", lambda: order.append("run"),
                                  lambda: order.append("reset"), lambda call: (0.0, 0.0))
    harness.measure([contender], one_rank, warmup=0, iters=1)
    assert order == ["reset", "sync", "run", "sync"]
    assert contender.seconds[0] >= 0.05


def test_the_exchange_sends_whole_buffers_on_nccl(monkeypatch):
    from commbench.comm import neighbor_exchange, transport
    from commbench.topology import build_schedule

    posted = {}

    def count(name):
        def post(chunks):
            posted[name] = sum(len(c) for c in chunks)
            return [transport.Handle(lambda: None) for _ in chunks]
        return post

    schedule = build_schedule("exponential-2", 8, dynamic=False)  # 3 in, 3 out
    for name in ("nccl", "gloo"):
        monkeypatch.setitem(neighbor_exchange.TRANSPORTS, name,
                            SimpleNamespace(post=count(name)))
        buffers = [torch.zeros(5 << 20 >> 2), torch.zeros(3 << 20 >> 2)]  # 5 MiB, 3 MiB
        exchange = neighbor_exchange.NeighborExchange(buffers, schedule, 0, transport=name)
        exchange.start()
        exchange.finish()
    assert posted["nccl"] == 2 * 6  # one message per buffer and peer
    assert posted["gloo"] == 8 * 6  # 1 MiB chunks


def test_a_cuda_error_is_not_blamed_on_the_image_size():
    from commbench.config import RunConfig
    from commbench.run_checks import check_image_size

    class Model(torch.nn.Module):
        def __init__(self, message):
            super().__init__()
            self.message = message

        def forward(self, x):
            raise RuntimeError(self.message)

    images = torch.zeros(1, 3, 8, 8)
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        check_image_size(Model("CUDA out of memory. Tried to allocate 2.00 GiB"), images,
                          RunConfig())
    with pytest.raises(RuntimeError, match="CUDNN_STATUS"):
        check_image_size(Model("cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"), images,
                          RunConfig())
    with pytest.raises(UsageError, match="--image-size: 224 is too small"):
        check_image_size(Model("Given input size: (512x1x1). Calculated output size: "
                                "(512x0x0). Output size is too small"), images, RunConfig())


def test_gpu_facts_are_recorded(monkeypatch):
    from commbench import environment

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: "Pretend GPU")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 90100)
    monkeypatch.setattr(environment, "gpu_driver", lambda: "550.54")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3")
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    ctx = SimpleNamespace(device=torch.device("cuda", 0), gpu_names=("A", "B"))
    facts = environment.gpu_facts(ctx)
    assert facts["gpus"] == ["A", "B"] and facts["gpu"] == "Pretend GPU"
    assert facts["nccl"] == "2.21.5" and facts["cudnn"] == 90100
    assert facts["gpu_driver"] == "550.54" and facts["cuda_visible_devices"] == "2,3"
    assert facts["nccl_variables"]["NCCL_IB_DISABLE"] == "1"
    assert set(facts["tf32"]) == {"matmul", "cudnn"} and "cudnn_benchmark" in facts


def test_bluefog_refuses_cuda_unless_its_ops_run_on_the_cpu(monkeypatch):
    from commbench.config import RunConfig
    from commbench.optimizers.bluefog import BluefogNeighborAllreduce

    ctx = SimpleNamespace(device=torch.device("cuda", 0), world_size=4, rank=0,
                          machine_size=4, num_machines=1)
    plugin = BluefogNeighborAllreduce(ctx, RunConfig())
    monkeypatch.delenv("BLUEFOG_OPS_ON_CPU", raising=False)
    with pytest.raises(UsageError, match="BLUEFOG_OPS_ON_CPU=1"):
        plugin._init()
    monkeypatch.setenv("BLUEFOG_OPS_ON_CPU", "1")
    assert plugin.facts()["ops_on_cpu"] is True


def test_neighbor_averaging_on_nccl_needs_torch_1_12(monkeypatch):
    from commbench.config import RunConfig
    from commbench.optimizers import neighbor_allreduce

    ctx = SimpleNamespace(device=torch.device("cuda", 0), backend="nccl", world_size=4,
                          rank=0, machine_size=4, num_machines=1, simulated_machines=False,
                          launch=LaunchInfo("torchrun", 0, 4, 0, 4, 0))
    monkeypatch.setattr(torch, "__version__", "1.10.2+cu102")
    with pytest.raises(UsageError, match="needs torch >= 1.12"):
        neighbor_allreduce.NeighborAllreduce(ctx, RunConfig(dist_optimizer="neighbor_allreduce"))
    monkeypatch.setattr(torch, "__version__", "2.14.1")
    plugin = neighbor_allreduce.NeighborAllreduce(ctx, RunConfig())
    assert plugin.facts()["message_bytes"] is None  # whole buffers on NCCL, recorded
