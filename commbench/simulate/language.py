"""What a projection of a language model (commbench.job.language_models) takes otherwise
than an image model's: its input is a sequence of --seq-len tokens, it counts tokens/sec,
its gradients' layout is read from its named size, and its compute comes only from a
calibration run of it (no stated device speed: a device's tokens/sec at one sequence
length is not a figure users carry around, and an invented one would be worse).
"""

from __future__ import annotations

import functools
import re
from typing import Dict, List, Optional, Tuple

from commbench.errors import UsageError
from commbench.job.language_models import LANGUAGE_MODELS
from commbench.simulate.compute import ELEMENT_BYTES, Gradients

# Forward FLOPs are a third of training's: 2N + 4 x layers x d_model x seq_len of
# 6N + 12 x layers x d_model x seq_len (commbench.job.language_models.flops_per_token).
FORWARD_SHARE = 1 / 3
_LAYER = re.compile(r"\.(\d+)\.")  # transformer.h.3.attn, model.layers.3.mlp


def is_language_model(model: str) -> bool:
    return model in LANGUAGE_MODELS


def input_size(config: Dict) -> int:
    """A run's input size as its group key holds it: a language model's tokens per
    sequence, an image model's pixels per side."""
    if is_language_model(str(config["model"])):
        return int(config.get("seq_len") or LANGUAGE_MODELS[config["model"]].seq_len)
    return int(config["image_size"])


def asked_size(args, model: str) -> Optional[int]:
    """The input size the flags ask of this kind of model (None: any; 0: none, the other
    kind's flag was given)."""
    own, other = ((args.seq_len, args.image_size) if is_language_model(model)
                  else (args.image_size, args.seq_len))
    return 0 if other is not None else own


def default_size(model: str) -> int:
    return LANGUAGE_MODELS[model].seq_len if is_language_model(model) else 224


def check(args, model: str, size: int, runs: List) -> None:
    """Refuse, in one line, the other kind's input flag, and a language model's projection
    that would rest on nothing measured: its compute comes from a calibration run of it."""
    if not is_language_model(model):
        if args.seq_len is not None:
            raise UsageError(f"argument --seq-len: {model} is an image model: give --image-size")
        return
    if args.image_size is not None:
        raise UsageError(f"argument --image-size: {model} is a language model: it reads "
                         "tokens; give --seq-len")
    if size > LANGUAGE_MODELS[model].context:
        raise UsageError(f"argument --seq-len: {model} takes at most "
                         f"{LANGUAGE_MODELS[model].context} tokens, not {size}")
    if args.img_sec is not None:
        raise UsageError(f"argument --img-sec: {model} is a language model: its compute "
                         "comes from a calibration run of it (commbench run --model "
                         f"{model}), not from a stated speed")
    if not runs:
        batch = f" at batch {args.batch_size}" if args.batch_size else ""
        raise UsageError(f"cannot project {model}: no run of it{batch} with sequences of "
                         f"{size} tokens under PATH to take its compute from; calibrate with "
                         f"`commbench run --model {model} --seq-len {size}` and pass its "
                         "result file")


def per_step(model: str, batch: int, size: int) -> int:
    """What one worker's step counts in the projection's unit: images, or tokens."""
    return batch * size if is_language_model(model) else batch


def rate(model: str) -> str:
    return "tokens/sec" if is_language_model(model) else "img/sec"


def unit_of(model: str) -> Dict[str, str]:
    """What a projection file's workload adds for a language model: its unit (an image
    model's file stays as it was: img/sec, no unit)."""
    return {"unit": "tokens"} if is_language_model(model) else {}


def described(model: str, batch: int, size: int) -> str:
    """The workload as the projection's title names it, as report titles a group."""
    shape = (f"sequences of {size} tokens" if is_language_model(model)
             else f"{size}x{size} images")
    return f"{model}, batch {batch} per worker, {shape}"


def gradients(model: str, size: int) -> Gradients:
    """The gradients' layout of either kind of model."""
    if is_language_model(model):
        return language_gradients(model, size)
    from commbench.simulate import compute

    return compute.gradients(model, size)


@functools.lru_cache(maxsize=8)
def language_gradients(name: str, seq_len: int) -> Gradients:
    """A language model's gradients, read from its parameters on the meta device (shapes
    only: no memory, no initialisation, so llama-1b costs nothing here). Backward passes
    the output layer first, then the blocks from the last to the first, each module taking
    FLOPs in proportion to its matrix parameters (6 a token each) and each block its
    attention's 12 x d_model x seq_len (counted at its first module, the last backward
    passes); the embedding tables (the token table shared with the output layer) are ready
    only at the end."""
    import torch

    from commbench.job import language_models

    net = language_models.build(name, "meta")
    tables = {id(p) for m in net.modules() if isinstance(m, torch.nn.Embedding)
              for p in m.parameters(recurse=False)}
    modules: Dict[str, List[torch.nn.Parameter]] = {}
    for pname, p in net.named_parameters():  # forward order; a tied table once
        modules.setdefault(pname.rpartition(".")[0], []).append(p)
    cost = {m: sum(p.numel() for p in ps if id(p) not in tables) for m, ps in modules.items()}
    attention = 2 * LANGUAGE_MODELS[name].d_model * seq_len  # 12 L d s / 6, per block
    layers = set()
    for m in modules:
        layer = _LAYER.search(m)
        if layer and layer.group(1) not in layers:
            layers.add(layer.group(1))
            cost[m] += attention
    output = net.get_output_embeddings().weight
    done = output.numel() if id(output) in tables else 0  # a tied head's product, first
    total = float(done + sum(cost.values()))
    ready: Dict[str, float] = {}
    for m in reversed(list(modules)):
        done += cost[m]
        ready[m] = done / total
    # (ready, a table: after the first block's modules, done at the same moment)
    params: List[Tuple[float, bool, int, Tuple[int, ...]]] = sorted(
        (1.0 if id(p) in tables else ready[m], id(p) in tables, p.numel() * ELEMENT_BYTES,
         tuple(p.shape)) for m, ps in modules.items() for p in ps)
    return Gradients(tuple(b for _, _, b, _ in params), tuple(r for r, _, _, _ in params),
                     FORWARD_SHARE, tuple(s for _, _, _, s in params))
