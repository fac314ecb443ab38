"""Which training samples each worker learns from (`--partition`): IID shards (a
seeded shuffle cut into equal parts), or label skew drawn from a Dirichlet
distribution over the classes per worker (`dirichlet:ALPHA`, the convention of the
federated and decentralized literature: small ALPHA gives each worker few classes);
text (`--data text:PATH`) has no labels, but files: `files` gives each worker its own
(commbench.data.text). The same seed gives every strategy the same partition."""

from __future__ import annotations

from typing import List, Tuple

from commbench.errors import UsageError

KINDS = "iid, dirichlet:ALPHA (ALPHA > 0), files (text)"


def parse(spec: str, data: str = "") -> Tuple[str, float]:
    """("iid", 0.0), ("dirichlet", alpha) or ("files", 0.0); data: the --data spec, whose
    kind decides whether the split it names can be made of it."""
    kind, _, value = spec.partition(":")
    text = data.split(":")[0] == "text"
    if kind in ("iid", "files") and not value:
        if kind == "files" and data and not text:
            raise UsageError(f"argument --partition: files gives each worker its own files "
                             f"of --data text:PATH, not of {data}: give iid or dirichlet:ALPHA")
        return kind, 0.0
    if kind == "dirichlet" and text:
        raise UsageError(f"argument --partition: {spec} skews the labels of a dataset; "
                         f"{data} has none: give iid or files (each worker its own files)")
    if kind == "dirichlet":
        try:
            alpha = float(value)
        except ValueError:
            alpha = 0.0
        if alpha > 0:
            return "dirichlet", alpha
    raise UsageError(f"argument --partition: {spec!r} is not one of {KINDS}")


def partition(labels, workers: int, spec: str, seed: int) -> List["object"]:
    """Each worker's sample indices (int64 tensors), by the --partition spec."""
    import numpy as np
    import torch

    kind, alpha = parse(spec)
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    if kind == "iid":
        order = rng.permutation(len(labels))
        share = len(labels) // workers
        shards = [order[w * share:(w + 1) * share] for w in range(workers)]
    else:
        shards_of: List[List[int]] = [[] for _ in range(workers)]
        for c in np.unique(labels):
            members = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet([alpha] * workers))[:-1] * len(members)).astype(int)
            for w, part in enumerate(np.split(members, cuts)):
                shards_of[w].extend(part.tolist())
        shards = [rng.permutation(np.array(s, dtype=np.int64)) for s in shards_of]
    empty = [w for w, s in enumerate(shards) if len(s) == 0]
    if empty:
        raise UsageError(f"argument --partition: {spec} leaves worker(s) "
                         f"{', '.join(map(str, empty))} no samples; use more samples, fewer "
                         "workers or a larger ALPHA")
    return [torch.as_tensor(s, dtype=torch.int64) for s in shards]


def class_mix(labels, shards, classes: int) -> List[List[int]]:
    """Samples of each class each worker holds: [worker][class]."""
    import numpy as np

    labels = np.asarray(labels)
    return [np.bincount(labels[np.asarray(s)], minlength=classes).tolist() for s in shards]


def describe(mix: List[List[int]]) -> str:
    """One line: each worker's samples, classes present, and its largest class's share."""
    parts = []
    for w, counts in enumerate(mix):
        total = sum(counts)
        top = max(range(len(counts)), key=counts.__getitem__)
        parts.append(f"worker {w}: {total} samples, {sum(c > 0 for c in counts)} classes, "
                     f"{100 * counts[top] / total:.0f}% class {top}")
    return "; ".join(parts)
