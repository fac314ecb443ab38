"""`commbench cluster up|down|status`: an emulated cluster of machines with capped
links on this host (see commbench/cluster/namespaces.py for what it is made of)."""

from __future__ import annotations

from commbench.cluster import namespaces, state

DEFAULT_NAME = "cb"


def add_arguments(parser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True,
                                parser_class=type(parser))
    up = sub.add_parser("up", help="make a cluster and print how to launch on it")
    up.add_argument("--machines", type=int, default=2, help="emulated machines (default 2)")
    up.add_argument("--slots", type=int, default=2,
                    help="ranks per machine in the printed launch lines (default 2)")
    up.add_argument("--link", default="1gbit",
                    help="each machine's NIC rate, both directions, as tc spells it "
                         "(default 1gbit; e.g. 200mbit, 10gbit)")
    up.add_argument("--link-of", action="append", default=[], metavar="MACHINE=RATE,...",
                    help="a rate of its own for a machine, by index from 0 (e.g. m3=100mbit: "
                         "uneven links); repeatable or comma-separated")
    down = sub.add_parser("down", help="remove a cluster and all it made")
    for action in (up, down):
        action.add_argument("--name", default=DEFAULT_NAME,
                            help=f"the cluster's name, prefix of all it makes "
                                 f"(default {DEFAULT_NAME})")
    down.add_argument("--all", action="store_true",
                      help="remove every emulated cluster that is up (or left by a crash)")
    sub.add_parser("status", help="the clusters that are up, and their pieces")


def main(args) -> int:
    if args.action == "up":
        cluster = namespaces.up(args.name, args.machines, args.slots, args.link, args.link_of)
        print(describe(cluster))
        return 0
    if args.action == "down":
        names = [c.name for c in state.clusters()] if args.all else [args.name]
        for name in names:
            removed = namespaces.down(name)
            print(f"cluster {name}: " + (f"removed {', '.join(removed)}" if removed
                                         else "nothing of it exists"))
        return 0
    found = state.clusters()
    if not found:
        print("no emulated cluster is up")
    for cluster in found:
        print(f"cluster {cluster.name}: {cluster.machines} machines x {cluster.slots} slots, "
              f"{cluster.link} links{uneven(cluster)}, subnet {cluster.subnet}")
        for piece, there in namespaces.status(cluster).items():
            print(f"  {piece}: {'up' if there else 'MISSING'}")
    return 0


def describe(c: state.Cluster) -> str:
    n = c.machines * c.slots
    return "\n".join([
        f"cluster {c.name}: {c.machines} machines "
        f"({', '.join(c.machine(i) for i in range(c.machines))})"
        f" x {c.slots} slots, each linked at {c.link} both ways{uneven(c)} (no latency added),"
        f" subnet {c.subnet}, host at {c.host_address} on {c.bridge}",
        "Launch on it from a shell that sourced its env.sh (its ssh first on PATH, and no "
        "binding of ranks to cores: the machines share the host's):",
        f"  . {c.directory / 'env.sh'}",
        f"  mpirun -H {c.hosts} -np {n} python -m commbench --dist-optimizer=allreduce",
        f"  horovodrun -np {n} -H {c.hosts} python -m commbench --dist-optimizer=horovod",
        f"  bfrun -np {n} -H {c.hosts} python -m commbench --dist-optimizer=neighbor_allreduce",
        f"Remove it: commbench cluster down --name {c.name}",
    ])


def uneven(c: state.Cluster) -> str:
    """The machines whose link differs, as the cluster's lines name them."""
    if not c.link_of:
        return ""
    return " but " + ", ".join(f"{c.machine(int(m[1:]))} at {rate}"
                               for m, rate in sorted(c.link_of.items(),
                                                     key=lambda kv: int(kv[0][1:])))
