"""Reading the results of runs trained to accuracy (kind "accuracy",
commbench.job.accuracy_loop) for `report`, `plot` and `compare`: the fields a reader
computes with, checked before it does (commbench.analysis.validate), and each file made
into an AccuracyRun of commbench.analysis.accuracy, its group key spelt out from the
run's settings. Pure functions of the files; no torch.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from commbench.analysis import validate
from commbench.analysis.accuracy import AccuracyKey, AccuracyRun
from commbench.analysis.reading import SPLIT_AND_WIRE_FIELDS, machine_of, series_of
from commbench.analysis.validate import MAYBE as _MAYBE
from commbench.analysis.validate import items, number, section, text, whole
from commbench.job.stop_rule import MAX_EPOCHS
from commbench.result.store import Result

KIND = "accuracy"

# What read computes with. A diverged run's curve holds NaN or infinite losses and
# consensus distances (shown as such); its accuracies, times and counts are numbers.
FIELDS = (
    text("config.model"), whole("config.batch_size", 1), whole("config.image_size", 1),
    number("config.target_accuracy", 0, 1, above=True, **_MAYBE),
    number("config.target_loss", 0, above=True, **_MAYBE),
    number("summary.best_loss", finite=False, **_MAYBE),
    number("curve.*.validation_loss", finite=False, **_MAYBE),
    whole("config.eval_every", 1, **_MAYBE), whole("summary.eval_every", 1, **_MAYBE),
    number("config.lr", **_MAYBE), number("config.momentum"),
    number("config.weight_decay", **_MAYBE), number("config.warmup_epochs", 0, **_MAYBE),
    number("config.max_epochs", 0, above=True, **_MAYBE),
    number("config.time_budget", 0, above=True, **_MAYBE), whole("config.seed", **_MAYBE),
    section("data", **_MAYBE), section("recipe", **_MAYBE),
    number("recipe.weight_decay", **_MAYBE),
    section("environment"), whole("environment.world_size", 1),
    validate.flag("summary.reached", **_MAYBE), number("summary.best_accuracy", 0, 1),
    text("summary.stopped_by"), number("summary.img_sec", 0, above=True, **_MAYBE),
    validate.load("summary.oversubscribed", **_MAYBE),
    section("summary.diverged", **_MAYBE), whole("summary.diverged.step", 1),
    whole("summary.diverged.rank", 0), *SPLIT_AND_WIRE_FIELDS,
    items("curve"), section("curve.*"), whole("curve.*.step", 0),
    number("curve.*.epoch", 0), number("curve.*.training_seconds", 0),
    number("curve.*.wall_seconds", 0), number("curve.*.accuracy", 0, 1),
    number("curve.*.worker_mean", 0, 1), number("curve.*.worker_worst", 0, 1),
    number("curve.*.loss", finite=False, **_MAYBE),
    number("curve.*.consensus_distance", finite=False, **_MAYBE),
)
# Besides, of a run that reached its target (time_to_target is checked in read, in words
# of its own).
REACHED_FIELDS = (
    number("summary.wall_time_to_target", 0, above=True, **_MAYBE),
    whole("summary.steps_to_target", 0, **_MAYBE),
    number("summary.epochs_to_target", 0, **_MAYBE),
    number("summary.bytes_to_target", 0, **_MAYBE),
)


def usable(found: Sequence[Result]) -> Tuple[List[AccuracyRun], List[str]]:
    """The runs of the accuracy results found that read can use, and one line per
    result skipped."""
    return validate.usable(list(found), KIND, (), lambda result: read(result.path, result.doc))


def read(path: Path, doc: Dict[str, Any]) -> AccuracyRun:
    """The run of an accuracy result; validate.Invalid names the field it cannot use."""
    validate.check(doc, FIELDS)
    config, summary = doc["config"], doc["summary"]
    env = doc["environment"]
    target = config.get("target_accuracy")
    target_loss = config.get("target_loss")
    facts = doc.get("data") or {}
    data = facts.get("data") or config["data"]
    if facts.get("augment"):  # runs augmented otherwise learnt another task
        data = f"{data}, {facts['augment']} augmentation"
    key = AccuracyKey(str(config["model"]), str(data), str(config.get("partition") or "iid"),
                      int(config["batch_size"]), shape_of(config),
                      target_of(target, target_loss),
                      int(summary.get("eval_every") or config["eval_every"]), budget_of(config),
                      training_of(doc), *machine_of(doc), str(config.get("tag") or ""))
    reached = None if target is None and target_loss is None else summary["reached"] is True
    if reached and not _positive(summary.get("time_to_target")):
        raise validate.Invalid("summary.time_to_target", f"is "
                               f"{validate.shown(summary.get('time_to_target'))}: it reached "
                               "the target but records no time to it")
    if reached:
        validate.check(doc, REACHED_FIELDS)

    def to_target(name: str, kind=float):
        # never a number for a run that did not reach the target, whatever the file says
        value = summary.get(name) if reached else None
        return None if value is None else kind(value)

    curve = tuple({k: float(p[k]) for k in CURVE_FIELDS + LOSS_FIELDS if k in p or
                   k in CURVE_FIELDS} for p in doc["curve"])
    if not curve:
        raise ValueError("its curve is empty")
    recovery = recovery_of(doc)
    # A torchft run's result is replica group 0's, a world of one: its workers are the groups.
    workers = int((recovery or {}).get("replica_groups") or env["world_size"])
    seed = config.get("seed")
    return AccuracyRun(
        path=Path(path), doc=doc, key=key, series=series_of(doc), workers=workers,
        seed=None if seed is None else int(seed), reached=reached,
        time=to_target("time_to_target"), wall_time=wall_time_of(reached, summary, recovery),
        steps=to_target("steps_to_target", int), epochs=to_target("epochs_to_target"),
        sent=to_target("bytes_to_target"),
        best_accuracy=float(summary["best_accuracy"]), stopped_by=str(summary["stopped_by"]),
        img_sec=_float(summary.get("img_sec")), curve=curve,
        oversubscribed=bool(summary.get("oversubscribed")), diverged=diverged_of(summary),
        best_loss=_float(summary.get("best_loss")), recovery=recovery)


def shape_of(config: Dict[str, Any]) -> int:
    """An image model's image size; a language model's sequence length, which it records
    instead (its image size is a flag it refuses)."""
    if config.get("seq_len") is not None:
        return int(config["seq_len"])
    return int(config["image_size"])


def target_of(accuracy, loss) -> str:
    """The target as the group shows it: "0.8", "loss 2.5", or "" (none)."""
    if loss is not None:
        return f"loss {float(loss):g}"
    return "" if accuracy is None else f"{float(accuracy):g}"


def wall_time_of(reached: Optional[bool], summary: Dict[str, Any],
                 recovery: Optional[Dict[str, Any]]) -> Optional[float]:
    """Wall seconds to the target: under a recovery policy, its own clock from the
    job's start, failures and recoveries included (a restarted job's loop resumes its
    checkpoint's clock, not its first start's)."""
    if not reached:
        return None
    kept = (recovery or {}).get("wall_time_to_target")
    found = summary.get("wall_time_to_target") if kept is None else kept
    return None if found is None else float(found)


def recovery_of(doc: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What --recovery restart recorded, where its goodput reads (None otherwise)."""
    found = doc.get("recovery")
    if not isinstance(found, dict) or not _positive(found.get("goodput")):
        return None
    return found


def diverged_of(summary: Dict[str, Any]) -> Optional[Dict[str, int]]:
    """Where the run diverged; {} for one that stopped as diverged without saying where."""
    if summary.get("diverged"):
        return dict(summary["diverged"])
    return {} if summary.get("stopped_by") == "diverged" else None


LOSS_FIELDS = ("validation_loss",)  # a language model's, besides
CURVE_FIELDS = ("step", "epoch", "training_seconds", "wall_seconds", "accuracy",
                "worker_mean", "worker_worst")


def training_of(doc: Dict[str, Any]) -> str:
    """The optimizer's settings, as rules rather than values where a value follows the
    worker count (the peak learning rate scaled with the total batch), so that one
    recipe at several worker counts stays one group."""
    config, recipe = doc["config"], doc.get("recipe") or {}
    if config.get("lr") is not None:
        lr = f"lr {float(config['lr']):g}"
    else:  # "linear scaling: 0.1 x 64/256": the rule, without this run's batch
        lr = "lr " + (str(recipe.get("lr_rule") or "default").split(":")[0])
    if recipe.get("optimizer_name") == "AdamW":  # a language model's recipe
        betas = "/".join(f"{float(b):g}" for b in recipe.get("betas") or ())
        parts = [f"AdamW {lr}", f"betas {betas}",
                 f"clipped to norm {float(recipe.get('max_grad_norm', 0)):g}"]
    else:
        parts = [f"SGD {lr}", f"momentum {float(config['momentum']):g}"]
    decay = recipe.get("weight_decay", config.get("weight_decay"))
    if decay is not None:
        parts.append(f"weight decay {float(decay):g}")
    schedule, warmup = recipe.get("schedule"), config.get("warmup_epochs")
    if schedule and schedule != "constant":
        parts.append(f"warm-up over {warmup:g} epoch{'' if warmup == 1 else 's'}, then "
                     "cosine decay" if "cosine" in schedule and warmup is not None
                     else str(schedule))
    if config.get("independent_init"):
        parts.append("independent init")
    return ", ".join(parts)


def budget_of(config: Dict[str, Any]) -> str:
    """What ends a run that misses the target, in the run's own terms."""
    epochs, seconds = config.get("max_epochs"), config.get("time_budget")
    if epochs is None and seconds is None:
        epochs = MAX_EPOCHS
    parts = ([f"{float(epochs):g} epochs"] if epochs is not None else []) + \
        ([f"{float(seconds):g} s"] if seconds is not None else [])
    return " or ".join(parts)


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _float(value) -> Optional[float]:
    return None if value is None else float(value)
