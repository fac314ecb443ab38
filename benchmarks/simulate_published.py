"""`commbench simulate` against published scaling tables, given only the hardware
facts each publication states (and, where it states no per-GPU speed, one calibration
point or a stated assumption, printed as such). Runs in seconds, no GPU needed.

    python benchmarks/simulate_published.py

No published table measures decentralized strategies (neighbor averaging) at scale;
one published figure does: Bluefog's README chart (ResNet-50, batch 64, 8 NVLink V100
per machine, 25 Gbit/s: Bluefog over 95% scaling efficiency, Horovod about 66% at 128
GPUs), checked at the end with an assumed per-GPU speed.
"""

import statistics

from commbench import units
from commbench.simulate import compute
from commbench.simulate.network import Link, Network
from commbench.simulate.project import Inputs, project
from commbench.simulate.step import Strategy

NVLINK_V100 = 130e9  # assumed: nccl-tests' allreduce bus bandwidth on 8 NVLink V100s
PCIE3 = 10e9  # assumed: a PCIe 3 x16 link's achievable bytes/s


def network(rate: str, intra: float, latency: float = 5e-6) -> Network:
    return Network(Link(2e-6, 1 / intra), Link(latency, 1 / (units.rate_bits(rate) / 8)))


SOURCES = [
    {
        "name": "DLPerf: NVIDIA DeepLearningExamples ResNet-50 v1.5, PyTorch",
        "stack": "PyTorch 1.5 (NGC 20.03), DDP, NCCL 2.5.6, DALI, FP32, V100-SXM2 16 GB x 8 "
                 "per node, 100 Gbit/s InfiniBand, batch 128",
        "model": ("resnet50", 224, 128), "strategy": "allreduce", "per_machine": 8,
        "network": network("100gbit", NVLINK_V100), "algorithms": ("ring", "tree"),
        "img_sec": 367.0, "compute_note": "1 GPU: 367 img/s (the publication's own)",
        "published": {8: 2888, 16: 5717, 32: 10917},
    },
    {
        "name": "RaySGD benchmark documentation: Horovod",
        "stack": "PyTorch 1.4, Horovod 0.19 (NCCL), ResNet-50 batch 128, AWS p3dn.24xlarge "
                 "(8 V100 32 GB NVLink, 100 Gbit/s)",
        "model": ("resnet50", 224, 128), "strategy": "horovod", "per_machine": 8,
        "network": network("100gbit", NVLINK_V100), "algorithms": ("ring", "tree"),
        "img_sec": 2769.7 / 8, "compute_note": "calibrated on its 8-GPU point (no 1-GPU "
        "figure published): 346.2 img/s per GPU",
        "published": {16: 5492.2, 32: 10733.4, 64: 21872.5},
    },
]
# Horovod's documentation: TensorFlow, 128 servers x 4 Pascal GPUs, 25 Gbit/s RoCE; it
# gives efficiencies, not per-GPU speeds. Per-GPU img/sec below are assumptions (P100
# figures of the order of TensorFlow's published tf_cnn_benchmarks), stated as such.
HOROVOD_DOCS = [
    ("resnet101", 224, 64, 125.0, 0.90),
    ("inception_v3", 299, 64, 140.0, 0.90),
    ("vgg16", 224, 64, 150.0, 0.68),
]


def projected(model, image, batch, strategy, per_machine, net, algorithms, img_sec, workers):
    grads = compute.gradients(model, image)
    c = compute.stated(img_sec, batch, grads.forward_share, "stated")
    inputs = Inputs(batch, grads, net, per_machine, {1: c}, algorithms)
    return {r.workers: r for r in project([Strategy(strategy)], workers, inputs)}


def main():
    errors = []
    for source in SOURCES:
        model, image, batch = source["model"]
        rows = projected(model, image, batch, source["strategy"], source["per_machine"],
                         source["network"], source["algorithms"], source["img_sec"],
                         sorted(source["published"]))
        print(f"{source['name']}\n  stack: {source['stack']}\n  compute: "
              f"{source['compute_note']}")
        print(f"  {'GPUs':>5} {'published':>10} {'projected':>10} {'error':>7}  allreduce")
        for n, value in sorted(source["published"].items()):
            row = rows[n]
            error = row.img_sec / value - 1
            errors.append(abs(error))
            print(f"  {n:>5} {value:>10.1f} {row.img_sec:>10.1f} {100 * error:>+6.1f}%  "
                  f"{row.step.algorithm} (exposed {row.step.exposed * 1e3:.1f} ms of "
                  f"{row.step.total * 1e3:.0f} ms)")
        print()
    print("Horovod documentation: TensorFlow, 4 Pascal GPUs per server, 25 Gbit/s RoCE, "
          "512 GPUs\n  compute: ASSUMED per-GPU img/sec (not in the publication); NCCL 2 "
          "of the time: ring only; PCIe inside a server (assumed)")
    print(f"  {'model':<13} {'img/s/GPU':>9} {'published E':>12} {'projected E':>12}")
    for model, image, batch, img_sec, published in HOROVOD_DOCS:
        row = projected(model, image, batch, "horovod", 4, network("25gbit", PCIE3),
                        ("ring",), img_sec, [512])[512]
        errors.append(abs(row.efficiency / published - 1))
        print(f"  {model:<13} {img_sec:>9.0f} {100 * published:>11.0f}% "
              f"{100 * row.efficiency:>11.1f}%  (exposed {row.step.exposed * 1e3:.0f} ms "
              f"of {row.step.total * 1e3:.0f} ms)")
    print("\nBluefog's README chart: ResNet-50 batch 64, 8 V100 (NVLink) per machine, "
          "25 Gbit/s, 128 GPUs\n  compute: ASSUMED 367 img/s per GPU (not in the "
          "publication); Horovod's allreduce over NCCL ring or tree")
    print(f"  {'strategy':<45} {'published E':>12} {'projected E':>12}")
    for name, published in (("neighbor_allreduce", 0.95), ("horovod", 0.66)):
        row = projected("resnet50", 224, 64, name, 8, network("25gbit", NVLINK_V100),
                        ("ring", "tree"), 367.0, [128])[128]
        errors.append(abs(row.efficiency / published - 1))
        print(f"  {Strategy(name).label():<45} {100 * published:>11.0f}% "
              f"{100 * row.efficiency:>11.1f}%  (exposed {row.step.exposed * 1e3:.0f} ms "
              f"of {row.step.total * 1e3:.0f} ms)")
    print(f"\nmedian |error| {100 * statistics.median(errors):.1f}%, worst "
          f"{100 * max(errors):.1f}% over {len(errors)} published points")
    latency_sensitivity()


def latency_sensitivity():
    """How projections move with the latency between machines, which no emulated
    cluster here can check (no netem): ResNet-50 at 367 img/s per V100, batch 32 (small
    batches put latency in view), 8 per machine, 25 Gbit/s."""
    print("\nLatency sensitivity (not validated here: emulated links add no latency): "
          "ResNet-50 batch 32, 367 img/s per GPU, 8 per machine, 25 Gbit/s; scaling "
          "efficiency at 1024 GPUs")
    latencies = (5e-6, 50e-6, 500e-6)
    print(f"  {'strategy':<58}" + "".join(f"{f'α={a * 1e6:g}us':>11}" for a in latencies))
    for name in ("allreduce", "neighbor_allreduce", "hierarchical_neighbor_allreduce"):
        cells = []
        for alpha in latencies:
            net = network("25gbit", NVLINK_V100, latency=alpha)
            row = projected("resnet50", 224, 32, name, 8, net, ("ring", "tree"), 367.0,
                            [1024])[1024]
            cells.append(f"{100 * row.efficiency:>10.1f}%")
        print(f"  {Strategy(name).label():<58}" + "".join(cells))


if __name__ == "__main__":
    main()
