"""The figures publications state for the scaling of their strategies, and the stacks
they ran on as benchmarks/models/simulate_published.py gives them to `commbench
simulate`: hardware, the transport profile their stack implies, the engine release and
one per-GPU speed (the publication's own, or a stated assumption)."""

from commbench import units
from commbench.simulate import transports
from commbench.simulate.link_costs import Link, Network
from commbench.simulate.strategy import Strategy

V100_NVLINK = "150GB/s"  # V100 SXM2: six NVLink 2 links of 25 GB/s each way
PCIE3 = Link(2e-6, 1 / 10e9, source="assumed: PCIe 3 x16, 10 GB/s achievable")


def network(inter: str, rate: str, intra: str = "nvlink", intra_rate: str = V100_NVLINK,
            intra_link: Link = None) -> Network:
    """Links of a stated line rate through named transport profiles."""
    inter_link = transports.PROFILES[inter].link(units.rate_bits(rate) / 8, None, 0.0, rate)
    if intra_link is None:
        intra_link = transports.PROFILES[intra].link(units.rate_bits(intra_rate) / 8, None,
                                                     0.0, intra_rate)
    return Network(intra_link, inter_link)


def bluefog(name: str) -> Strategy:
    """As Bluefog's examples/pytorch_benchmark.py ran it: the dynamic exponential-2
    schedule (inner-outer for neighbor_allreduce on several machines, exponential-2
    over machines for the hierarchical one), adapt-with-combine."""
    return Strategy(name, "exponential-2", True)


HOROVOD_2020 = Strategy("horovod", horovod_version="0.20")
# Read off docs/_static/bf_full_benchmark1.png (batch 64) and bf_full_benchmark2.png
# (batch 32) of Bluefog-Lib/bluefog at commit 0f23999 (2020-11-05), the commit that
# published them: each bar's top against the gridlines, to about one pixel (about 110
# img/s at batch 64, 80 at batch 32).
BLUEFOG_64 = {
    HOROVOD_2020: {16: 5309, 32: 9859, 64: 17443, 128: 30227},
    bluefog("bluefog.hierarchical_neighbor_allreduce"): {16: 5200, 32: 10293, 64: 20368,
                                                         128: 40737},
    bluefog("bluefog.neighbor_allreduce"): {16: 5526, 32: 10834, 64: 21343, 128: 43120},
}
BLUEFOG_32 = {
    HOROVOD_2020: {16: 3897, 32: 5489, 64: 10427, 128: 14807},
    bluefog("bluefog.hierarchical_neighbor_allreduce"): {16: 3578, 32: 7002, 64: 14090,
                                                         128: 28026},
    bluefog("bluefog.neighbor_allreduce"): {16: 4613, 32: 8834, 64: 16638, 128: 32964},
}
BLUEFOG_STACK = ("AWS p3.16xlarge: 8 V100 NVLink per machine, 25 Gbit/s, no EFA: NCCL "
                 "over TCP sockets (nccl-socket; NCCL 2.7.8 of Bluefog's dockerfile.gpu "
                 "opens 2 x 8 sockets on AWS NICs, so no per-flow cap binds); Horovod of "
                 "the time (0.20.x: 5 ms cycles, 64 MiB fusion); Bluefog's own engine")

SOURCES = [
    {
        "name": "DLPerf: NVIDIA DeepLearningExamples ResNet-50 v1.5, PyTorch",
        "short": "DLPerf batch 128",
        "stack": "PyTorch 1.5 (NGC 20.03), DDP, NCCL 2.5.6, DALI, FP32, V100-SXM2 16 GB x 8 "
                 "per node, 100 Gbit/s InfiniBand (nccl-ib), batch 128",
        "model": ("resnet50", 224, 128), "per_machine": 8,
        "network": network("nccl-ib", "100gbit"),
        "img_sec": 367.0, "compute_note": "1 GPU: 367 img/s (the publication's own)",
        "points": {Strategy("allreduce"): {8: 2888, 16: 5717, 32: 10917}},
    },
    {
        "name": "RaySGD benchmark documentation: Horovod",
        "short": "RaySGD batch 128",
        "stack": "PyTorch 1.4, Horovod 0.19 (NCCL; 0.17-0.20 defaults), ResNet-50 batch "
                 "128, AWS p3dn.24xlarge (8 V100 32 GB NVLink, 100 Gbit/s; no EFA plugin "
                 "stated: nccl-socket)",
        "model": ("resnet50", 224, 128), "per_machine": 8,
        "network": network("nccl-socket", "100gbit"),
        "img_sec": 2769.7 / 8, "compute_note": "calibrated on its 8-GPU point (no 1-GPU "
        "figure published): 346.2 img/s per GPU",
        "points": {Strategy("horovod", horovod_version="0.20"):
                   {16: 5492.2, 32: 10733.4, 64: 21872.5}},
    },
    {
        "name": "Bluefog documentation, performance page: ResNet-50 batch 64",
        "short": "Bluefog docs batch 64",
        "stack": BLUEFOG_STACK,
        "model": ("resnet50", 224, 64), "per_machine": 8,
        "network": network("nccl-socket", "25gbit"),
        "img_sec": 350.0, "compute_note": "the chart's linear-scaling box: 44,770 img/s at "
        "128 GPUs -> 350 img/s per GPU",
        "points": BLUEFOG_64,
    },
    {
        "name": "Bluefog documentation, performance page: ResNet-50 batch 32",
        "short": "Bluefog docs batch 32",
        "stack": BLUEFOG_STACK,
        "model": ("resnet50", 224, 32), "per_machine": 8,
        "network": network("nccl-socket", "25gbit"),
        "img_sec": 314.0, "compute_note": "the linear-scaling box of the same page's batch-32 "
        "chart (bf_benchmark1.png): 20,100 img/s at 64 GPUs -> 314 img/s per GPU",
        "points": BLUEFOG_32,
    },
]
# Horovod's documentation: TensorFlow, 128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE
# (nccl-ib), Horovod of 2017-18 (0.13-0.16 defaults: no response cache); it gives
# efficiencies, not per-GPU speeds. Per-GPU img/sec below are assumptions (P100 figures
# of the order of TensorFlow's published tf_cnn_benchmarks), stated as such.
HOROVOD_DOCS = [
    ("resnet101", 224, 64, 125.0, 0.90),
    ("inception_v3", 299, 64, 140.0, 0.90),
    ("vgg16", 224, 64, 150.0, 0.68),
]
