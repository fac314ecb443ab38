"""The generated language (commbench.data.language): a source from its seed, its entropy
rate against a brute-force and an empirical one, a model that knows the source's order
learning down to the floor, and what cannot be generated or learnt refused in one line."""

import math

import numpy as np
import pytest
import torch

from cli_helpers import refused
from commbench.data.language import MarkovLanguage


def brute_force_rate(source: MarkovLanguage) -> float:
    """The entropy rate from the dense transition matrix over contexts and its left
    eigenvector of eigenvalue 1, by numpy's eigensolver (nothing shared with the source's
    own power iteration)."""
    tokens, probabilities = source.table
    dense = np.zeros((source.contexts, source.contexts))
    for context in range(source.contexts):
        for token, p in zip(tokens[context].tolist(), probabilities[context].tolist()):
            dense[context, (context * source.vocab) % source.contexts + token] += p
    values, vectors = np.linalg.eig(dense.T)
    pi = np.real(vectors[:, np.argmin(np.abs(values - 1))])
    pi /= pi.sum()
    p = probabilities.numpy()
    return float(pi @ -(p * np.log(p)).sum(axis=1))


def empirical_rate(source: MarkovLanguage, ids) -> float:
    """The mean of -log p(next token | its context) along drawn sequences."""
    tokens, probabilities = source.table
    losses = []
    for row in ids.tolist():
        context = sum(t * source.vocab ** (source.order - 1 - i)
                      for i, t in enumerate(row[:source.order]))
        for token in row[source.order:]:
            allowed = tokens[context].tolist()
            losses.append(-math.log(float(probabilities[context, allowed.index(token)])))
            context = (context * source.vocab) % source.contexts + token
    return sum(losses) / len(losses)


@pytest.mark.parametrize("knobs", ["vocab=3,order=2,branch=2", "vocab=5,order=1,branch=3",
                                   "vocab=4,order=3"])
def test_the_entropy_rate_is_the_brute_force_one_and_what_samples_lose(knobs):
    source = MarkovLanguage.parse(knobs, seed=7)
    assert source.entropy_rate == pytest.approx(brute_force_rate(source), abs=1e-10)
    assert 0 < source.entropy_rate < math.log(source.branch)
    ids = source.draw(200, 200, seed=1)
    assert empirical_rate(source, ids) == pytest.approx(source.entropy_rate, abs=0.03)


def test_a_bigram_model_learns_an_order_one_source_down_to_the_floor():
    source = MarkovLanguage.parse("vocab=16,order=1,branch=4", seed=3)
    train, held_out = source.draw(400, 500, seed=1), source.draw(100, 500, seed=2)
    counts = torch.full((16, 16), 1e-3, dtype=torch.float64)  # a little smoothing
    counts.index_put_((train[:, :-1].reshape(-1), train[:, 1:].reshape(-1)),
                      torch.ones(train[:, 1:].numel(), dtype=torch.float64), accumulate=True)
    log_p = (counts / counts.sum(dim=1, keepdim=True)).log()
    loss = -float(log_p[held_out[:, :-1], held_out[:, 1:]].mean())
    assert loss == pytest.approx(source.entropy_rate, abs=0.01)
    uniform = math.log(16)
    assert loss < 0.5 * uniform  # far below what a model that learnt nothing loses


def test_a_source_is_its_seed_and_each_seed_draws_other_sequences():
    source = MarkovLanguage.parse("vocab=32,order=2", seed=5)
    again = MarkovLanguage.parse("vocab=32,order=2", seed=5)
    assert source.entropy_rate == again.entropy_rate
    assert torch.equal(source.draw(8, 20, seed=1), again.draw(8, 20, seed=1))
    assert not torch.equal(source.draw(8, 20, seed=1), source.draw(8, 20, seed=2))
    other = MarkovLanguage.parse("vocab=32,order=2", seed=6)
    assert other.entropy_rate != source.entropy_rate
    ids = source.draw(8, 20, seed=1)
    assert ids.shape == (8, 20) and int(ids.max()) < 32 and int(ids.min()) >= 0


def test_the_default_source_is_lm_tinys_vocabulary_at_order_two():
    source = MarkovLanguage.parse("", seed=0)
    assert (source.vocab, source.order, source.branch, source.samples) == (256, 2, 4, 10000)
    assert source.describe() == "language:vocab=256,order=2,branch=4,samples=10000"
    assert source.validation_samples == 256  # a tenth, at most 256: evaluation stays cheap


@pytest.mark.parametrize("args, message", [
    (["--data", "language:vocab=1"], "argument --data: language's 'vocab=1' is not one of "
                                     "vocab=V (2 or more)"),
    (["--data", "language:order=0"], "argument --data: language's 'order=0' is not one of"),
    (["--data", "language:words=3"], "argument --data: language's 'words=3' is not one of"),
    (["--data", "language:vocab=4,branch=5"], "argument --data: language's branch=5 is more "
                                              "than its vocab=4 tokens"),
    (["--data", "language:order=3"], "argument --data: language's vocab=256, order=3 make "
                                     "16777216 contexts of 256 tokens; at most 67108864"),
    (["--data", "language:vocab=300"], "argument --data: language's vocab=300 is more than "
                                       "lm-tiny's vocabulary of 256 tokens"),
    (["--data", "language", "--partition", "dirichlet:0.1"],
     "argument --partition: the generated language gives each worker its own stream"),
    (["--data", "language", "--augment", "none"], "argument --augment: augments the images"),
])
def test_what_cannot_be_generated_is_refused_in_one_line(args, message):
    assert message in refused("--model", "lm-tiny", *args)


def test_the_language_with_an_image_model_is_refused_in_one_line():
    assert "argument --data: language is a language model's data (tokens); resnet18 is an " \
           "image model" in refused("--model", "resnet18", "--data", "language")


def test_each_worker_draws_its_own_stream_with_next_token_labels():
    from commbench.data import batches

    source = MarkovLanguage.parse("vocab=8,order=1,samples=64", seed=1)
    mine, theirs = (batches.language(source, 4, 10, rank, 2, "cpu", seed=42)
                    for rank in (0, 1))
    inputs, labels = mine.next()
    assert inputs.shape == (4, 10) and labels.shape == (40,)
    assert torch.equal(inputs[:, 1:], labels.view(4, 10)[:, :-1])  # the next tokens
    assert not torch.equal(inputs, theirs.next()[0])  # another worker, another stream
    assert mine.facts == {"data": "language:vocab=8,order=1,branch=4,samples=64",
                          "partition": "iid", "entropy_rate": source.entropy_rate,
                          "steps_per_epoch": 8}
    held_out, next_tokens = batches.validation(source, 0, 42, seq_len=10)
    assert held_out.shape == (6, 10) and next_tokens.shape == (6, 10)
