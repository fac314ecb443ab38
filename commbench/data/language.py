"""A generated language with a known floor (`--data language`): a sparse random Markov
source over `vocab` tokens whose next token depends on the last `order` tokens (the
context). Each context allows `branch` next tokens, drawn from the seed, with
probabilities drawn from a flat Dirichlet; one token (the "home" token, also from the
seed) is allowed after every context, so that every context reaches the all-home
context, which follows itself: the chain has one closed class and it is aperiodic, so
its stationary distribution is unique and the entropy rate well defined.

The entropy rate, sum over contexts of stationary probability x the entropy of the
next token, is what a model that knew the source would lose per token: the floor of
the loss. Sequences are windows of the stationary process (each starts from a context
drawn from the stationary distribution), so every position from the order-th on costs
at least the floor, and the first few more (they see less than a whole context).

Knobs, spelled as `learnable`'s: vocab=V (default 256, lm-tiny's), order=K (default 2),
branch=B (default 4), samples=N (sequences per epoch, default 10000; the validation set
is a tenth of it, at most MAX_VALIDATION)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Optional, Tuple

from commbench.data.knobs import parse as parse_knobs
from commbench.errors import UsageError

# The most contexts x vocab the source tabulates (vocab ** (order + 1)): drawing each
# context's tokens ranks the whole vocabulary once per context, a quarter of a gigabyte
# at this bound.
MAX_CELLS = 1 << 26
# The stationary distribution is found by iterating the chain until no probability
# moves by more than this (in L1): exact to float64's rounding for any target a user
# could give.
TOLERANCE = 1e-13
MAX_ITERATIONS = 100_000
# The most validation sequences: every evaluation scores them twice (the averaged model
# and each worker's own), outside the clock but not outside the run's wall time; 256
# sequences of lm-tiny's 128 tokens take seconds on a CPU and estimate the loss to
# about a hundredth of a nat.
MAX_VALIDATION = 256
BYTES = 256  # text's tokens are its bytes (commbench.data.text)
KNOBS = {"vocab": int, "order": int, "branch": int, "samples": int}
FORM = "vocab=V (2 or more), order=K (1 or more), branch=B (1..vocab), samples=N (> 0)"


@dataclass(frozen=True)
class MarkovLanguage:
    vocab: int = 256
    order: int = 2
    branch: int = 4
    samples: int = 10000  # training sequences in an epoch; validation: a tenth, at most 256
    seed: int = 0

    @classmethod
    @lru_cache(maxsize=8)
    def parse(cls, knobs: str, seed: int) -> "MarkovLanguage":
        """`vocab=64,order=1,branch=3,samples=2000` (any subset, any order). The same
        knobs and seed give the same (frozen) source, so that the checks before a run
        and the run itself tabulate it and find its floor once."""
        values = parse_knobs(knobs, KNOBS, lambda name, v: v >= (2 if name == "vocab" else 1),
                             "language", FORM)
        found = cls(seed=seed, **values)
        if found.branch > found.vocab:
            raise UsageError(f"argument --data: language's branch={found.branch} is more "
                             f"than its vocab={found.vocab} tokens")
        if found.contexts * found.vocab > MAX_CELLS:
            raise UsageError(f"argument --data: language's vocab={found.vocab}, "
                             f"order={found.order} make {found.contexts} contexts of "
                             f"{found.vocab} tokens; at most {MAX_CELLS} are tabulated: "
                             "lower the vocab or the order")
        return found

    def describe(self) -> str:
        return (f"language:vocab={self.vocab},order={self.order},branch={self.branch},"
                f"samples={self.samples}")

    @property
    def validation_samples(self) -> int:
        return max(1, min(self.samples // 10, MAX_VALIDATION))

    def floor_line(self) -> str:
        """What a run prints at start-up: the source, and the loss no model can beat."""
        return (f"language: vocab {self.vocab}, order {self.order}, branch {self.branch}, "
                f"entropy rate {self.entropy_rate:.4f} nats/token = floor of the loss")

    @property
    def contexts(self) -> int:
        return self.vocab ** self.order

    @cached_property
    def table(self) -> Tuple["object", "object"]:
        """(tokens, probabilities), each contexts x branch: the tokens allowed after each
        context (the home token first) and their probabilities."""
        import torch

        generator = torch.Generator().manual_seed(self.seed)
        home = int(torch.randint(self.vocab, (1,), generator=generator))
        # the other branch - 1 tokens: distinct, drawn from all but the home token
        ranks = torch.rand(self.contexts, self.vocab, generator=generator)
        ranks[:, home] = 2.0  # never among the smallest
        others = ranks.argsort(dim=1)[:, :self.branch - 1]
        tokens = torch.cat([torch.full((self.contexts, 1), home), others], dim=1)
        weights = -torch.rand(self.contexts, self.branch, generator=generator,
                              dtype=torch.float64).log()  # Dirichlet(1, ..., 1)
        return tokens, weights / weights.sum(dim=1, keepdim=True)

    def follows(self, contexts, tokens):
        """The context after `contexts` (indices, a context's tokens read as base-vocab
        digits, the oldest first) when `tokens` come next."""
        return (contexts * self.vocab) % self.contexts + tokens

    @cached_property
    def stationary(self):
        """The stationary distribution over contexts, by iterating the chain from the
        uniform distribution (it converges: one closed class, aperiodic)."""
        import torch

        tokens, probabilities = self.table
        sources = torch.arange(self.contexts).unsqueeze(1).expand_as(tokens)
        targets = self.follows(sources, tokens).reshape(-1)
        pi = torch.full((self.contexts,), 1.0 / self.contexts, dtype=torch.float64)
        for _ in range(MAX_ITERATIONS):
            moved = (pi.unsqueeze(1) * probabilities).reshape(-1)
            after = torch.zeros_like(pi).index_add_(0, targets, moved)
            if float((after - pi).abs().sum()) < TOLERANCE:
                return after
            pi = after
        raise RuntimeError(f"{self.describe()}: the stationary distribution did not "
                           f"converge in {MAX_ITERATIONS} iterations")

    @cached_property
    def entropy_rate(self) -> float:
        """Nats per token that the source itself loses: the floor of any model's loss."""
        _, probabilities = self.table
        per_context = -(probabilities * probabilities.log()).sum(dim=1)
        return float((self.stationary * per_context).sum())

    def draw(self, count: int, length: int, seed: int):
        """`count` sequences of `length` tokens (int64, count x length) drawn from `seed`:
        each a window of the stationary process, its first `order` tokens the digits of
        a context drawn from the stationary distribution."""
        import torch

        tokens, probabilities = self.table
        cumulative = probabilities.cumsum(dim=1)
        generator = torch.Generator().manual_seed(seed)
        context = torch.multinomial(self.stationary, count, replacement=True,
                                    generator=generator)
        out = torch.empty(count, max(length, self.order), dtype=torch.int64)
        for i in range(self.order):  # the starting context's digits, the oldest first
            out[:, i] = context // self.vocab ** (self.order - 1 - i) % self.vocab
        for i in range(self.order, out.shape[1]):
            u = torch.rand(count, 1, generator=generator, dtype=torch.float64)
            pick = (u > cumulative[context]).sum(dim=1).clamp_(max=self.branch - 1)
            out[:, i] = tokens[context, pick]
            context = self.follows(context, out[:, i])
        return out[:, :length]


def check_pairing(data: str, model: str, model_vocab: Optional[int], seed: int) -> None:
    """The generated language and text go with a language model whose vocabulary holds
    their tokens (text's are its bytes: 256); a language model trains on them or on
    synthetic tokens. Refused in one line otherwise (model_vocab: None for an image
    model)."""
    kind, _, knobs = data.partition(":")
    if kind in ("language", "text") and model_vocab is None:
        raise UsageError(f"argument --data: {kind} is a language model's data (tokens); "
                         f"{model} is an image model: give --model lm-tiny (or another "
                         "language model, `commbench list`), or other --data")
    if model_vocab is not None and kind not in ("synthetic", "language", "text"):
        raise UsageError(f"argument --data: {model} trains on synthetic tokens, the "
                         "generated language (--data language[:knobs]) or text (--data "
                         f"text:PATH), not {data}")
    if kind not in ("language", "text"):
        return
    vocab = MarkovLanguage.parse(knobs, seed).vocab if kind == "language" else BYTES
    if vocab > model_vocab:
        raise UsageError(f"argument --data: {kind}'s vocab={vocab} is more than {model}'s "
                         f"vocabulary of {model_vocab} tokens")
