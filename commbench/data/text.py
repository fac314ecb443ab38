"""Real text from a local path (`--data text:PATH`) for a language model: one UTF-8 text
file, or a folder of them read recursively in sorted order (names starting with "." are
skipped: a checkout's .git, an editor's files). Nothing is downloaded and no tokenizer
is needed: the tokens are the bytes (256 ids), so a language model's vocabulary must
hold 256.

The last tenth of every file (its bytes, rounded down) is held out: the validation text
is those tails joined in file order, cut into sequences, at most MAX_VALIDATION of them
chosen from the seed. The training text is the rest of every file, joined in file order
and cut into non-overlapping windows of --seq-len + 1 bytes (a sequence and its next
tokens), as GPT-style training joins documents; a window may span two files.

How the training windows are split among the workers (`--partition`):
- iid: the windows of all the text, interleaved (worker w takes windows w, w + N, ...);
- files: each worker its own files (a seeded shuffle of the files dealt round-robin),
  its windows cut from them alone: documents that differ between workers, as label skew
  does for images.

Everything a run could not train on is refused in one line before any communication:
a missing path, no text files, an empty file, a binary one (a NUL byte, or not UTF-8),
more than MAX_BYTES in all, too little text for one training or validation sequence
(or for one per worker), fewer files than workers under `--partition files`."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import List, Tuple

from commbench.data.language import MAX_VALIDATION
from commbench.errors import UsageError

# Every rank holds the whole text in memory (and a copy as windows): 64 MiB keeps that
# within reach of a machine with many ranks, and is hundreds of epochs for a small model.
MAX_BYTES = 64 << 20
HELD_OUT = 10  # one part in HELD_OUT of every file is the validation text


@dataclass(frozen=True)
class TextCorpus:
    path: str
    names: Tuple[str, ...]  # the files, relative to path, in the order they are read
    texts: Tuple[bytes, ...] = field(repr=False, compare=False)

    @classmethod
    @lru_cache(maxsize=4)
    def parse(cls, path: str) -> "TextCorpus":
        """The text of `--data text:PATH`, every file read and checked. The same path
        gives the same (frozen) corpus, so the checks before a run and the run itself
        read it once."""
        if not path:
            raise UsageError("argument --data: text needs a path: text:PATH (a UTF-8 file "
                             "or a folder of them)")
        root = Path(path)
        if not root.exists():
            raise UsageError(f"argument --data: text:{path}: no such file or folder "
                             "(commbench never downloads data)")
        files = [root] if root.is_file() else sorted(
            p for p in root.rglob("*") if p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(root).parts))
        if not files:
            raise UsageError(f"argument --data: text:{path}: no text files in the folder")
        total = sum(p.stat().st_size for p in files)
        if total > MAX_BYTES:
            raise UsageError(f"argument --data: text:{path} holds {total} bytes, more than "
                             f"the {MAX_BYTES >> 20} MiB a run reads into memory: point it "
                             "at a part")
        names = tuple(p.name if p == root else str(p.relative_to(root)) for p in files)
        return cls(path, names, tuple(checked(p, f"text:{path}", n)
                                      for p, n in zip(files, names)))

    def describe(self) -> str:
        return f"text:{self.path}"

    @property
    def size(self) -> int:
        return sum(len(t) for t in self.texts)

    def held_out(self, text: bytes) -> int:
        """Where a file's validation tail starts."""
        return len(text) - len(text) // HELD_OUT

    def training(self, length: int, files: List[int]):
        """The training windows (uint8, count x length) of the given files' text."""
        return windows(b"".join(self.texts[i][:self.held_out(self.texts[i])] for i in files),
                       length)

    def validation(self, length: int, seed: int):
        """The validation windows (uint8, count x length): at most MAX_VALIDATION, chosen
        from the seed, in their order in the text."""
        import torch

        found = windows(b"".join(t[self.held_out(t):] for t in self.texts), length)
        if len(found) == 0:
            raise UsageError(f"argument --data: {self.describe()}: its held-out text (the "
                             f"last tenth of each file, {self.size // HELD_OUT} bytes or "
                             f"so) is shorter than one sequence of {length} bytes (--seq-len "
                             "+ 1): give more text or a shorter --seq-len")
        if len(found) > MAX_VALIDATION:
            chosen = torch.randperm(len(found), generator=torch.Generator().manual_seed(seed))
            found = found[chosen[:MAX_VALIDATION].sort().values]
        return found

    def shards(self, length: int, workers: int, spec: str, seed: int
               ) -> List[Tuple[List[int], "object"]]:
        """Each worker's (files, training windows) under the --partition spec: under iid
        every worker reads from every file."""
        import numpy as np

        everything = list(range(len(self.names)))
        if spec == "iid":
            found = self.training(length, everything)
            if len(found) < workers:
                raise UsageError(f"argument --data: {self.describe()}'s training text makes "
                                 f"{len(found)} sequences of {length} bytes (--seq-len + 1), "
                                 f"fewer than the {workers} workers: give more text or a "
                                 "shorter --seq-len")
            return [(everything, found[w::workers]) for w in range(workers)]
        if len(self.names) < workers:
            raise UsageError(f"argument --partition: files gives each worker its own files; "
                             f"{self.describe()} holds {len(self.names)}, fewer than the "
                             f"{workers} workers: give more files, or --partition iid")
        order = np.random.default_rng(seed).permutation(len(self.names))
        dealt = [sorted(order[w::workers].tolist()) for w in range(workers)]
        found = [(files, self.training(length, files)) for files in dealt]
        short = [w for w, (_, ids) in enumerate(found) if len(ids) == 0]
        if short:
            raise UsageError(f"argument --partition: files leaves worker {short[0]} less "
                             f"training text than one sequence of {length} bytes (--seq-len "
                             "+ 1): give longer files or a shorter --seq-len")
        return found


def checked(path: Path, where: str, name: str) -> bytes:
    """The bytes of one file, refused in one line unless they are UTF-8 text."""
    try:
        text = path.read_bytes()
    except OSError as e:
        raise UsageError(f"argument --data: {where}: cannot read {name}: "
                         f"{e.strerror or e}") from None
    if not text:
        raise UsageError(f"argument --data: {where}: {name} is empty")
    nul = text.find(b"\0")
    if nul >= 0:
        raise UsageError(f"argument --data: {where}: {name} is binary, not text (a NUL byte "
                         f"at byte {nul})")
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"argument --data: {where}: {name} is not UTF-8 text (byte "
                         f"{e.start}: {text[e.start]:#04x})") from None
    return text


def windows(text: bytes, length: int):
    """Non-overlapping windows of `length` bytes, as token ids (uint8, count x length)."""
    import torch

    count = len(text) // length
    if count == 0:
        return torch.empty(0, length, dtype=torch.uint8)
    flat = torch.frombuffer(bytearray(text[:count * length]), dtype=torch.uint8)
    return flat.view(count, length)
