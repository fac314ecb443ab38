"""Decoder-only language models by name: a small registry of named sizes, each a config
dataclass (as nanoGPT and torchtitan define their models), built from scratch with
transformers' configuration classes (GPT2LMHeadModel, LlamaForCausalLM): no weights,
nothing downloaded. FLOPs per token are counted here, once, from the built model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict

from commbench.errors import UsageError

INSTALL_HINT = "the language models need `pip install transformers`"


@dataclass(frozen=True)
class LanguageModelSpec:
    """One named size: the shape of the transformer, its vocabulary, the longest
    sequence it takes (`context`) and the --seq-len a run uses when none is given."""

    family: str  # "gpt2" (learned positions, GELU MLP) or "llama" (RoPE, SwiGLU, RMSNorm)
    layers: int
    heads: int
    d_model: int
    vocab: int
    context: int
    seq_len: int
    ffn: int = 0  # llama's SwiGLU width (gpt2's MLP is 4 x d_model)
    kv_heads: int = 0  # llama's grouped-query key/value heads
    summary: str = ""

    def transformers_config(self):
        import transformers

        if self.family == "gpt2":
            # No dropout, as nanoGPT pretrains: a speed run's steps stay alike.
            return transformers.GPT2Config(
                n_layer=self.layers, n_head=self.heads, n_embd=self.d_model,
                vocab_size=self.vocab, n_positions=self.context, resid_pdrop=0.0,
                embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=self.vocab - 1,
                eos_token_id=self.vocab - 1, use_cache=False)
        return transformers.LlamaConfig(
            num_hidden_layers=self.layers, num_attention_heads=self.heads,
            num_key_value_heads=self.kv_heads, hidden_size=self.d_model,
            intermediate_size=self.ffn, vocab_size=self.vocab,
            max_position_embeddings=self.context, rope_theta=500000.0,
            tie_word_embeddings=True, use_cache=False)


# lm-tiny's vocabulary of 256 is a byte's: what byte-level text and a generated
# language of at most 256 symbols need. gpt2-small is GPT-2's 124M; llama-1b has
# Llama 3.2 1B's shape.
LANGUAGE_MODELS: Dict[str, LanguageModelSpec] = {
    "lm-tiny": LanguageModelSpec("gpt2", layers=4, heads=4, d_model=256, vocab=256,
                                 context=1024, seq_len=128,
                                 summary="GPT-2 shape, for CPUs"),
    "gpt2-small": LanguageModelSpec("gpt2", layers=12, heads=12, d_model=768, vocab=50257,
                                    context=1024, seq_len=1024, summary="GPT-2's 124M"),
    "llama-1b": LanguageModelSpec("llama", layers=16, heads=32, d_model=2048, vocab=128256,
                                  context=8192, seq_len=2048, ffn=8192, kv_heads=8,
                                  summary="Llama 3.2 1B's shape"),
}


def is_language_model(name: str) -> bool:
    return name in LANGUAGE_MODELS


def check_installed(name: str) -> None:
    """A language model asked for where transformers is missing is one line, on every
    rank, before the job starts."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise UsageError(f"argument --model: {name} is a language model: {INSTALL_HINT}")


def build(name: str, device=None):
    """The named model with freshly initialised weights; on the "meta" device, its
    shapes alone (no memory, no initialisation: what counting parameters needs)."""
    check_installed(name)
    import torch
    import transformers

    config = LANGUAGE_MODELS[name].transformers_config()
    family = (transformers.GPT2LMHeadModel if LANGUAGE_MODELS[name].family == "gpt2"
              else transformers.LlamaForCausalLM)
    if device is None:
        return family(config)
    with torch.device(device):
        return family(config)


def logits_per_token(model):
    """The model, answering token ids [batch, seq] with one row of logits per token
    ([batch x seq, vocab]) instead of transformers' output object: the training step's
    cross-entropy against the next tokens, flattened alike, is then the language
    model's loss, with nothing in the step told which kind of model it trains."""
    model.register_forward_hook(lambda _, inputs, output: output.logits.flatten(0, 1))
    return model


def parameter_counts(model) -> Dict[str, int]:
    """All parameters, and N, those a token's matrix products go through: all but the
    embedding tables, the output layer included even where it shares the token table
    (nanoGPT's count; its product with every token is work)."""
    import torch

    tables = {id(p) for m in model.modules() if isinstance(m, torch.nn.Embedding)
              for p in m.parameters(recurse=False)}
    total = sum(p.numel() for p in model.parameters())
    output = model.get_output_embeddings().weight
    tied = output.numel() if id(output) in tables else 0
    matmul = sum(p.numel() for p in model.parameters() if id(p) not in tables) + tied
    return {"parameters": total, "non_embedding": matmul}


def facts(name: str, model, seq_len: int) -> Dict[str, Any]:
    """What a speed run's summary records of a language model ({} for an image model):
    its parameters and FLOPs per token, counted here where it is built (MFU, which needs
    the throughput, is added with it: commbench.job.peak_flops)."""
    if not is_language_model(name):
        return {}
    counts = parameter_counts(model)
    return {"parameters": counts["parameters"],
            "flops_per_token": flops_per_token(name, counts["non_embedding"], seq_len)}


def flops_per_token(name: str, non_embedding: int, seq_len: int) -> int:
    """Training FLOPs per token as torchtitan and the PaLM paper count them: 6N for the
    forward and backward matrix products of the N non-embedding parameters, plus
    attention's scores and weighted sum, 12 x layers x d_model x seq_len."""
    spec = LANGUAGE_MODELS[name]
    return 6 * non_embedding + 12 * spec.layers * spec.d_model * seq_len
