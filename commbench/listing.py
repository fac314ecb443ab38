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
    _list_language_models()
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


def _list_language_models() -> None:
    """Each language model with its parameter count, taken from the model itself built
    on the meta device (its shapes alone: no memory, no initialisation)."""
    from commbench.job import language_models

    names = language_models.LANGUAGE_MODELS
    try:
        import transformers  # noqa: F401
    except ImportError:
        print(f"Language models (--model): {', '.join(names)}; NOT USABLE: "
              f"{language_models.INSTALL_HINT}")
        return
    print("Language models (--model):")
    width = max(len(name) for name in names)
    for name, spec in names.items():
        counts = language_models.parameter_counts(language_models.build(name, "meta"))
        print(f"  {name:<{width}}  {counts['parameters'] / 1e6:7.1f}M parameters, "
              f"{spec.layers} layers x {spec.d_model} wide, vocabulary {spec.vocab}, "
              f"--seq-len {spec.seq_len} by default ({spec.summary})")
