"""Result files: one JSON document per run, written atomically, never overwritten,
and read back by `report`, `plot` and `compare` without ever crashing on a stranger.

Schema (version 1), a `run` result:

    format            "commbench-result" (how readers recognise our files)
    schema_version    1
    kind              "run" (a training benchmark)
    commbench_version, created (UTC ISO-8601), status ("ok")
    config            every RunConfig field
    strategy          {"name", "decentralized", ...plugin facts such as topology}
    environment       versions, hosts, devices, launcher, sizes, git commit
    samples           raw per-rank data: iteration_seconds [rank][iter],
                      batch_seconds [rank][iter][batch], reference_seconds
                      [rank][iter] or null, reference_batch_seconds [rank][iter]
                      [batch], reference_windows [rank][half] ([start, end]),
                      reference_phase_seconds [rank][batch][forward, backward,
                      optimizer] (commbench.timing.spans.PHASES), loss [rank][iter],
                      consensus_distance [iter] or null, parameter_digests [rank],
                      first_non_finite_step [rank] (null where every loss was finite)
    summary           commbench.result.metrics.summarize() of the samples, plus
                      parameters_identical, final_loss, final_consensus_distance,
                      diverged (below), wire (commbench.result.record), and
                      wire_unrecorded: true (present only then) when the strategy
                      communicates but counted no byte on the wire, and unit: what
                      the throughputs and bytes_per_image count, "images" or a
                      language model's "tokens" (absent in older files: images); a
                      language model's run adds parameters, flops_per_token and mfu
                      (null on a CPU or a GPU whose peak is not known)
    recipe            a language model's run only: its AdamW recipe
                      (commbench.job.language_recipe.LanguageRecipe's fields)

An `accuracy` result (a run trained to accuracy, commbench.job.accuracy_loop) has the same
header, config, strategy and environment, and instead of samples:

    data              the task, the partition and each worker's class mix
    recipe            commbench.job.recipe.Recipe: peak_lr, lr_rule, momentum,
                      weight_decay, warmup_steps, total_steps, time_budget, schedule
                      (a language model's: LanguageRecipe's, AdamW's)
    curve             one entry per evaluation: step, epoch, samples,
                      training_seconds, wall_seconds, accuracy (the averaged model),
                      worker_mean, worker_worst, loss, consensus_distance
    summary           commbench.job.accuracy_loop.outcome(): target_accuracy, reached,
                      time_to_target, wall_time_to_target, steps/epochs/samples_to_target
                      (null when not reached: never a time), best_accuracy,
                      best_at_step, stopped_by ("target", "max epochs", "time
                      budget" or "diverged"), steps, training_seconds, wall_seconds,
                      img_sec, eval_every, max_steps, time_budget, oversubscribed,
                      step_split (as a run's, over the last --timeline-steps steps),
                      diverged (below)

A language model's accuracy result (--target-loss) also records data.entropy_rate (the
generated language's floor of the loss, nats/token), in each curve entry
validation_loss and perplexity (the averaged model's; its accuracies are per next token)
and in its summary target_loss, best_loss, best_loss_at_step, best_perplexity and unit
"tokens" (its samples and img_sec count tokens); target_accuracy is null.
A language model's result on text (--data text:PATH, either kind) records in data the
partition, files, bytes and shards (each worker's files and sequences), and no
entropy_rate (real text's floor is unknown).
    clock_offsets     each rank's clock offset to rank 0's and its uncertainty

Numbers that are not finite (a loss that became NaN or inf in a run that diverged)
are written as the strings "NaN", "Infinity" and "-Infinity" (NON_FINITE), so that
files stay strict JSON; readers turn them back into floats. A run whose loss went
non-finite says where in `summary.diverged`: {"step": S, "rank": R}, the first
training step (from 1, warm-up included) whose loss was not finite and the rank it
was first seen on; null when every loss was finite.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import re
import shutil
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Tuple, Union

from commbench.config.flags import flag
from commbench.config.sections import Section
from commbench.errors import NotRecorded, UsageError

FORMAT = "commbench-result"
# A program that starts a job (`commbench sweep`) names a file here; rank 0 writes the
# path of the job's result file into it, so the program reads that exact result.
RECEIPT = "COMMBENCH_RESULT_RECEIPT"
SCHEMA_VERSION = 1
MAX_RESULT_BYTES = 256 * 2**20  # anything larger is not a result of ours
MIN_FREE_BYTES = 16 * 2**20  # raw samples of a large job take a few MiB
# How a number that is not finite is written: JSON has no NaN or infinity.
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
# Sections that hold only what the user typed or the machine reported: never decoded.
VERBATIM = ("config", "environment")


@dataclass(frozen=True)
class OutputFlags(Section):
    title = "results"

    results_dir: str = flag("results", "directory for result files", metavar="DIR")
    tag: str = flag("", "free-form label stored with the result (e.g. an A/B arm)")


@dataclass(frozen=True)
class Result:
    path: Path
    doc: Dict[str, Any]

    @property
    def kind(self) -> str:
        return self.doc.get("kind", "run")


def new_document(kind: str) -> Dict[str, Any]:
    from commbench import __version__

    return {
        "format": FORMAT,
        "schema_version": SCHEMA_VERSION,
        "kind": kind,
        "commbench_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "status": "ok",
    }


def ensure_writable(directory: Union[str, Path]) -> Path:
    """Fail at start-up, not after the benchmark, when results cannot be written."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".probe-") as probe:
            probe.write(b"x" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
        free = shutil.disk_usage(directory).free
    except OSError as e:
        raise UsageError(f"argument --results-dir: cannot write to {str(directory)!r}: "
                         f"{e.strerror or e}")
    if free < MIN_FREE_BYTES:
        raise UsageError(f"argument --results-dir: {str(directory)!r} has only "
                         f"{free // 1024} KiB free; a result needs up to "
                         f"{MIN_FREE_BYTES // 2**20} MiB")
    return directory


def result_name(doc: Dict[str, Any], stem: str) -> str:
    stamp = doc["created"].replace("-", "").replace(":", "")[:15]
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", stem)
    return f"{stamp}-{safe}-{uuid.uuid4().hex[:8]}.json"


def write_result(directory: Union[str, Path], doc: Dict[str, Any], stem: str) -> Path:
    """Write doc under a new, unique name; atomically (temp file, then link). A file
    that cannot be written (a disk that filled during the run) is NotRecorded, naming
    it and why: nothing of it is left on disk, so what was printed is all there is."""
    directory = Path(directory)
    data = to_json(doc, indent=1).encode()
    while True:
        final = directory / result_name(doc, stem)
        try:
            write_new_file(final, data)
        except FileExistsError:
            continue
        except OSError as e:
            raise NotRecorded(f"the result was not written to {final}: {e.strerror or e}; "
                              "the numbers printed above are all that is left of it") from None
        _leave_receipt(final)
        return final


def to_json(doc: Any, **options: Any) -> str:
    """doc as strict JSON, a number that is not finite written as NON_FINITE says."""
    return json.dumps(encode_non_finite(doc), allow_nan=False, **options)


def encode_non_finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: encode_non_finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encode_non_finite(v) for v in value]
    return value


def decode_non_finite(value: Any) -> Any:
    """The inverse of encode_non_finite: the NON_FINITE strings back into floats."""
    if isinstance(value, str):
        return NON_FINITE.get(value, value)
    if isinstance(value, dict):
        return {k: decode_non_finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_non_finite(v) for v in value]
    return value


def write_new_file(path: Union[str, Path], data: bytes) -> None:
    """Write data to path atomically (temp file, then link): readers never see a part
    of it, and an existing file is never overwritten (FileExistsError)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".partial-", suffix=path.suffix)
    try:
        # mkstemp makes the file private (0600); a result is meant to be shared
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # fails rather than overwrite an existing file
    finally:
        os.unlink(tmp)


def _leave_receipt(path: Path) -> None:
    receipt = os.environ.get(RECEIPT)
    if receipt:
        Path(receipt).write_text(str(path))


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _result_files(paths: Iterable[Union[str, Path]]) -> Iterable[Path]:
    for path in map(Path, paths):
        if path.is_dir():
            yield from sorted(p for p in path.rglob("*.json") if not p.name.startswith("."))
        else:
            yield path


def load_results(paths: Iterable[Union[str, Path]]) -> Tuple[List[Result], List[str]]:
    """Every commbench result under paths, and one warning per file that is skipped."""
    results, warnings = [], []
    for path in _result_files(paths):
        try:
            results.append(Result(path, read_result(path)))
        except ValueError as e:
            warnings.append(f"skipping {path}: {e}")
    return results, warnings


def read_result(path: Path) -> Dict[str, Any]:
    """Parse one file as data only; ValueError says why it is not a usable result."""
    try:
        if path.stat().st_size > MAX_RESULT_BYTES:
            raise ValueError("too large to be a commbench result")
        with open(path, "rb") as f:
            doc = json.loads(f.read().decode("utf-8"))
    except OSError as e:
        raise ValueError(f"cannot read it ({e.strerror or e})")
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ValueError("not valid JSON (empty, truncated or corrupt)")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError("not a commbench result")
    version = doc.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"malformed: its schema_version is {version!r}, not a whole "
                         "number from 1")
    if version > SCHEMA_VERSION:
        raise ValueError(f"schema version {version!r} is newer than this commbench "
                         f"understands ({SCHEMA_VERSION}); upgrade commbench")
    if doc.get("status") != "ok":
        raise ValueError(f"the run did not complete (status {doc.get('status')!r})")
    for key in ("config", "summary"):
        if not isinstance(doc.get(key), dict):
            raise ValueError(f"missing its {key!r} section")
    return {key: value if key in VERBATIM else decode_non_finite(value)
            for key, value in doc.items()}
