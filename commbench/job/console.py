"""What rank 0 prints during a run: the header, a line per timed iteration (with the
consensus distance of decentralized strategies), and the summary; only rank 0 prints,
flushed, so output from many ranks never interleaves. It prints only: what it prints
was measured elsewhere (commbench.job.per_iteration, commbench.result.record)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from commbench import units
from commbench.result import metrics
from commbench.config.run_config import RunConfig
from commbench.job.per_iteration import IterationMeans, oversubscribed
from commbench.timing.step_split import PARTS

if TYPE_CHECKING:  # pragma: no cover
    from commbench.result.record import Recorded


class Printer:
    """Only rank 0 prints, flushed, so output from many ranks never interleaves."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __call__(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)


def iteration_line(means: IterationMeans, kind: str, unit: str = "images") -> str:
    """A timed iteration's means over all workers (measurements.AfterIteration), with
    the consensus distance of decentralized strategies."""
    rate = metrics.rate_name({"unit": unit})
    line = f"Iter #{means.index}: {means.img_sec:.1f} {rate} per {kind}, loss {means.loss:.4f}"
    if means.consensus_distance is not None:
        line += f", consensus distance {means.consensus_distance:.3g}"
    return line


def print_header(say: Printer, config: RunConfig, ctx, strategy) -> None:
    kind = ctx.device_kind
    images = "synthetic" if config.data == "synthetic" else "learnable"
    if config.language_model is not None:
        tokens = {"synthetic": "synthetic", "text": "byte-level text"}.get(
            config.data.split(":")[0], "generated-language")
        say(f"Model: {config.model} (sequences of {config.per_sample} {tokens} tokens)")
    else:
        say(f"Model: {config.model} ({config.image_size}x{config.image_size} {images} images)")
    say(f"Batch size: {config.batch_size} per {kind}")
    say(f"Number of {kind}s: {ctx.world_size} (launcher: {ctx.launch.launcher}, "
        f"{ctx.num_machines} machine(s))")
    crowded = oversubscribed(ctx)
    if crowded:
        say(f"Oversubscribed: {crowded['workers']} workers on {crowded['machine']}, which has "
            f"{crowded['physical_cores']} physical core(s): this run measures CPU sharing, "
            "not communication")
    say(f"Strategy: {strategy.name} - {strategy.summary}")
    facts = strategy.facts()
    transport, why = facts.get("transport", ctx.backend), facts.get("transport_reason", "")
    small = facts.get("small_message_transport")
    below = f"; below {facts['small_message_bytes'] >> 10} KB over {small}" if small else ""
    inside = facts.get("machine_transport")
    if inside and inside != transport:
        below += f"; inside each machine over {inside}"
    moved = f" (CPU tensors move over {transport}: {why}{below})" if ctx.launch.mpi and \
        ctx.device.type == "cpu" and why else ""
    say(f"Backend: {ctx.backend} on {ctx.device}{moved}")


def print_summary(say: Printer, summary: Dict[str, Any], ctx) -> None:
    kind = ctx.device_kind
    per, total = summary["img_sec_per_worker"], summary["total_img_sec"]
    rate = metrics.rate_name(summary)
    say(f"{rate.capitalize()} per {kind}: {per['mean']:.1f} +-{per['spread']:.1f}")
    say(total_line(summary, kind))
    if total["ci95"] is not None:
        say(f"  (+- is 1.96 std of the {total['n']} iterations; 95% confidence interval of "
            f"the mean: {total['mean'] - total['ci95']:.1f} .. "
            f"{total['mean'] + total['ci95']:.1f})")
    lat = summary["latency_seconds_per_batch"]
    say("Latency per batch: " + ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in lat.items()))
    say(split_line(summary.get("step_split"), ctx.device.type))
    for line in wire_lines(summary):
        say(line)
    if "efficiency_in_job" in summary:
        efficiency = percent(summary["efficiency_in_job"], summary.get("efficiency_in_job_ci95"))
        overhead = percent(summary["communication_overhead"],
                           summary.get("communication_overhead_ci95"))
        say(f"Compute-only: {summary['compute_only_img_sec_per_worker']:.1f} {rate} per "
            f"{kind}; in-job scaling efficiency {efficiency}; communication overhead {overhead}")
    if "flops_per_token" in summary:
        say(f"FLOPs per token: {summary['flops_per_token']:.4g} (6N + attention); "
            + mfu_words(summary.get("mfu")))
    for flag in metrics.trust_flags(summary):
        say(f"NOT TO BE TRUSTED ({flag}): {metrics.FLAGS[flag]}")
    if summary.get("diverged"):
        say(f"{diverged_line(summary['diverged'])}; the {rate} above were measured all the "
            "same")


def mfu_words(mfu: Optional[float]) -> str:
    """The run's MFU (commbench.job.peak_flops), or why there is none."""
    if mfu is None:
        return "MFU: not known (no datasheet peak for this device: a CPU, or a GPU not listed)"
    if mfu > 1:
        return f"MFU: {mfu:.1%}, above 100%: NOT TO BE TRUSTED (the peak or the count is wrong)"
    return f"MFU: {mfu:.1%} of the GPU's dense bf16 peak"


def diverged_line(diverged: Dict[str, int]) -> str:
    return (f"Diverged at step {diverged['step']}: the training loss was not finite there "
            f"(first seen on rank {diverged['rank']})")


def split_line(split: Optional[Dict[str, Any]], device: str = "cpu") -> str:
    """Where a step's time went, in means that add up to the step's."""
    if split is None and device != "cpu":
        return ("Step split: on GPUs only with --timeline, whose kernel times from "
                "torch.profiler lie in their steps (the host's clock sees when work was "
                "queued, not when the device did it)")
    if split is None:
        return ("Step split: not measured (this strategy's engine communicates inside its "
                "own optimizer step, out of commbench's sight)")
    ms = {part: 1000 * split[part]["mean"] for part in PARTS if part in split}
    codec = f"compression codec {ms['codec']:.1f} + " if ms.get("codec") else ""
    injected = f"injected delay {ms['injected']:.1f} + " if ms.get("injected") else ""
    return (f"Step split (mean per step): {ms['step']:.1f} ms = compute {ms['compute']:.1f} + "
            f"{codec}exposed communication {ms['exposed']:.1f} + waiting for peers "
            f"{ms['waiting']:.1f} + {injected}other {ms['other']:.1f}; communication hidden "
            f"behind compute {ms['overlapped']:.1f}")


def wire_lines(summary: Dict[str, Any]) -> List[str]:
    """What each rank put on the wire per step; for a strategy that communicates in some
    steps only, those steps and the others apart."""
    sent = summary.get("wire")
    if sent is None:
        return ["On the wire: not measured (this strategy's engine communicates inside its "
                "own optimizer step, out of commbench's sight)"]
    if summary.get("wire_unrecorded"):
        return ["On the wire: NOT RECORDED: this strategy communicates but counted no bytes "
                "(docs/plugins.md, \"Bytes on the wire\"); its 0 bytes are not what it sent"]
    messages = "messages the engine fused out of sight" if sent["messages_per_step"] is None \
        else f"{sent['messages_per_step']:.1f} messages"
    lines = [f"On the wire (sent per rank): {units.format_bytes(sent['bytes_per_step'])} in "
             f"{messages} per step, "
             f"{units.format_bytes(sent['bytes_per_image'])} per "
             f"{metrics.UNITS[summary.get('unit') or 'images'][1]}; "
             f"{100 * sent['communicating_steps']:.0f}% of steps communicate"]
    by_steps = summary.get("step_split_by_steps")
    if by_steps:
        steps = {kind: 1000 * split["step"]["mean"] for kind, split in by_steps.items()}
        lines.append(f"  steps that communicate: {steps['communicating']:.1f} ms each, "
                     f"sending {units.format_bytes(sent['bytes_per_communicating_step'])}; "
                     f"the others: {steps['local']:.1f} ms")
    return lines


def percent(value: float, ci) -> str:
    """A fraction as a percentage, with its 95% CI where known."""
    shown = f"{100 * value:.1f}%"
    if ci is None:
        return shown
    return f"{shown} (95% CI {100 * (value - ci):.1f}..{100 * (value + ci):.1f}%)"


def total_line(summary: Dict[str, Any], kind: str) -> str:
    """The run's headline, as printed at its end (and by `sweep` for each job)."""
    total = summary["total_img_sec"]
    return (f"Total {metrics.rate_name(summary)} on {summary['workers']} {kind}(s): "
            f"{total['mean']:.1f} "
            f"+-{total['spread']:.1f}")


def training_plan(say: Printer, rule, steps_per_epoch: int, recipe) -> None:
    loss = rule.metric == "loss"
    bounds = [f"target {'loss' if loss else 'accuracy'} {rule.target:g}"
              + (" nats/token" if loss else "") if rule.target is not None else None,
              f"at most {rule.max_steps} steps ({rule.max_steps / steps_per_epoch:.3g} "
              "epochs)" if rule.max_steps is not None else None,
              f"a time budget of {rule.time_budget:g} s" if rule.time_budget else None]
    say(f"Training to {'a target loss' if loss else 'accuracy'}: "
        f"{', '.join(b for b in bounds if b)}; evaluating every "
        f"{rule.eval_every} steps, the clock paused")
    say(recipe.describe())


def text_line(facts: Dict[str, Any]) -> str:
    """Real text's line at start-up: what was read, each worker's share, and that the
    floor of its loss is not known (no source to compute an entropy rate from)."""
    shares = "; ".join(f"worker {w}: {s['files']} files, {s['sequences']} sequences"
                       for w, s in enumerate(facts["shards"]))
    return (f"Data: {facts['data']}, {facts['files']} files, "
            f"{facts['bytes']} bytes (the last tenth of each file held out), "
            f"{facts['steps_per_epoch']} steps per epoch; partition {facts['partition']}: "
            f"{shares}; floor of the loss unknown (real text)")


def point_line(point) -> str:
    scored = "accuracy" if point.validation_loss is None else (
        f"validation loss {point.validation_loss:.4f} (perplexity {point.perplexity:.3g}), "
        "next-token accuracy")
    return (f"Step {point.step} (epoch {point.epoch:.2f}): {scored} {point.accuracy:.3f} "
            f"averaged model, {point.worker_mean:.3f} worker mean, {point.worker_worst:.3f} "
            f"worst; loss {point.loss:.4f}; consensus distance {point.consensus_distance:.3g}; "
            f"{point.training_seconds:.1f} s training, {point.wall_seconds:.1f} s wall")


def sent_to_target(outcome: Dict[str, Any]) -> str:
    sent = outcome.get("bytes_to_target")
    return "" if sent is None else f", {units.format_bytes(sent)} sent per rank"


def trained_line(outcome: Dict[str, Any]) -> str:
    """How a run trained to accuracy ended: its time to the target, or "not reached"
    with its best accuracy (never a time); a language model's, to a target loss, counting
    tokens."""
    loss = outcome.get("unit") == "tokens"
    target = outcome["target_loss"] if loss else outcome["target_accuracy"]
    named = "" if target is None else f"target {'loss ' if loss else ''}{target:g}"
    if outcome["reached"]:
        return (f"Time to {named}: "
                f"{outcome['time_to_target']:.1f} s of training "
                f"({outcome['wall_time_to_target']:.1f} s wall with evaluation), "
                f"{outcome['steps_to_target']} steps, {outcome['epochs_to_target']:.2f} "
                f"epochs, {outcome['samples_to_target']} {'tokens' if loss else 'samples'}"
                + sent_to_target(outcome))
    missed = "" if target is None else f"{named.capitalize()} not reached" + \
        (": diverged; " if outcome["stopped_by"] == "diverged" else "; ")
    why = "at the first evaluation since it diverged," \
        if outcome["stopped_by"] == "diverged" else f"by the {outcome['stopped_by']}"
    best = (f"best loss {outcome['best_loss']:.4f} (perplexity "
            f"{outcome['best_perplexity']:.3g}) at step {outcome['best_loss_at_step']}"
            if loss else f"best accuracy {outcome['best_accuracy']:.3f} at step "
            f"{outcome['best_at_step']}")
    return (f"{missed}{best}; stopped {why} after "
            f"{outcome['steps']} steps ({outcome['training_seconds']:.1f} s of training)")


def print_outcome(say: Printer, outcome: Dict[str, Any]) -> None:
    say(trained_line(outcome))
    if outcome.get("diverged"):
        say(diverged_line(outcome["diverged"]))
    say(f"{metrics.rate_name(outcome).capitalize()} during training: "
        f"{outcome['img_sec']:.1f} (all workers)")


def timeline_lines(say, config: RunConfig, steps: int, recorded: "Recorded") -> None:
    """Where the --timeline file went, and how much of the run it holds; or, when it
    could not be written, a warning that says so (the result was written first)."""
    if config.timeline is None:
        return
    if recorded.timeline_error:
        say(f"Warning: the timeline was not written ({recorded.timeline_error}); the "
            "result was")
    else:
        window = "" if steps <= config.timeline_steps else \
            f" (the last {config.timeline_steps} of {steps} steps: --timeline-steps)"
        say(f"Timeline: {config.timeline}{window}")
    if recorded.doc["strategy"].get("engine_timeline"):
        say(f"The engine's own timeline: {recorded.doc['strategy']['engine_timeline']}")
