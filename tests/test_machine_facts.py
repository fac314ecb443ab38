"""What a result records of each machine it ran on (commbench.result.environment.machine_facts):
its network interfaces and their speed, its RDMA devices, its GPU topology, read from a
sysfs tree made here; and, from a real run, under each machine's hostname."""

import socket
from pathlib import Path

import pytest

from commbench.result import environment
from launchers import TINY_RUN, mpiexec, only_result


def sysfs(root: Path) -> Path:
    """A /sys/class with one physical NIC at 100 Gbit/s, one virtual one whose driver
    refuses to say its speed, loopback, and one InfiniBand device of one port."""
    net = root / "net"
    for name, files in (("eth0", {"speed": "100000", "operstate": "up", "mtu": "9000"}),
                        ("veth1", {"operstate": "up", "mtu": "1500"}),
                        ("lo", {"speed": "", "operstate": "unknown", "mtu": "65536"})):
        (net / name).mkdir(parents=True)
        for file, text in files.items():
            (net / name / file).write_text(text + "\n")
    (net / "eth0" / "device").mkdir()
    (net / "veth1" / "speed").mkdir()  # reading it fails, as the kernel's EINVAL does
    port = root / "infiniband" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    for file, text in (("rate", "100 Gb/sec (4X EDR)"), ("state", "4: ACTIVE"),
                       ("link_layer", "InfiniBand")):
        (port / file).write_text(text + "\n")
    return root


def test_each_nic_with_its_speed_and_each_rdma_port_with_its_rate(tmp_path):
    facts = environment.machine_facts(False, sysfs(tmp_path))
    assert facts["nics"] == {
        "eth0": {"speed_mbit": 100000, "state": "up", "mtu": 9000, "virtual": False},
        "veth1": {"speed_mbit": None, "state": "up", "mtu": 1500, "virtual": True}}
    assert facts["rdma"] == {"mlx5_0": {"1": {"rate": "100 Gb/sec (4X EDR)",
                                              "state": "4: ACTIVE",
                                              "link_layer": "InfiniBand"}}}
    assert facts["gpu_topology"] is None  # asked for on GPUs only


def test_a_machine_without_sysfs_records_nothing_rather_than_failing(tmp_path):
    assert environment.machine_facts(False, tmp_path / "missing") == {
        "nics": {}, "rdma": {}, "gpu_topology": None}


@pytest.mark.mpi
def test_a_result_records_the_facts_of_each_machine_by_hostname(tmp_path):
    done = mpiexec(2, ["-m", "commbench", *TINY_RUN, "--results-dir", str(tmp_path)],
                   timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    machines = only_result(tmp_path)["environment"]["machines"]
    assert list(machines) == [socket.gethostname()]
    recorded, now = machines[socket.gethostname()], environment.machine_facts(False)
    assert recorded["rdma"] == now["rdma"] and recorded["gpu_topology"] is None
    # the machine's own devices (virtual ones come and go with emulated clusters)
    devices = {name: nic for name, nic in now["nics"].items() if not nic["virtual"]}
    assert {name: recorded["nics"][name] for name in devices} == devices
