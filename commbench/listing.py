"""`commbench list`: the strategies, topologies and models this installation knows,
and for each strategy whether it can run here and, if not, why."""

from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("--models", action="store_true",
                        help="also list every torchvision model name")


def main(args) -> int:
    from commbench import registry

    rows = registry.describe_all()
    width = max([len(r["name"]) for r in rows] + [8])
    print("Strategies (--dist-optimizer):")
    for r in rows:
        state = "usable" if r["usable"] else f"NOT USABLE: {r['why_not']}"
        print(f"  {r['name']:<{width}}  {state}  [{r['source']}]")
        if r["summary"]:
            print(f"  {'':<{width}}  {r['summary']}")
        if r["options"]:
            print(f"  {'':<{width}}  its flags: {' '.join(r['options'])}")
        if r["compressions"]:
            print(f"  {'':<{width}}  --compression: {', '.join(r['compressions'])}")
    _list_topologies()
    from commbench.job.models import model_names

    names = model_names()
    if args.models:
        print(f"Models (--model): {', '.join(names)}")
    else:
        print(f"Models (--model): {len(names)} torchvision models, e.g. resnet18, resnet50, "
              "vgg16 (--models lists all)")
    from commbench.launch.mpirun_front import missing_front

    warning = missing_front()
    if warning:
        print(f"Warning: {warning}")
    return 0


def _list_topologies() -> None:
    try:
        from commbench import topology
    except ImportError:
        return
    print("Topologies (--topology):")
    for name, description, has_dynamic in topology.describe():
        dynamic = "static and dynamic" if has_dynamic else "static only"
        print(f"  {name:<24}  {description} ({dynamic})")
