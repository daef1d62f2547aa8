"""A draft model's fast form: what `model:PATH|NAME` runs when `;quant=`, `;vocab=` and `;window=` are left
open, for any draft (a GGUF file, a Hugging Face folder, a named one):

    quant   w4a8-all: every linear, the LM head included, in 4-bit blocks times int8 activations, the
            cheapest draft step (lossy for the draft only: the output stays the target's)
    vocab   the head keeps the VOCAB most frequent ids of the target's tokenizer (ranked once by content
            on shipped text, drafters/draft_models/ranking.py), where the vocabulary is over twice that: on the Qwen
            pair the 151,936-row head was most of the 0.5B's step
    window  the draft reads a long prompt's first 4 and last WINDOW - 4 tokens, fewer for a generation
            of fewer than WINDOW new tokens: as many as it may add, at least 64 (drafters/draft_models/window.py)

A draft too small for the kernels to pay (under MIN_PARAMS parameters, e.g. the tests' tiny models),
in float64, on `--runtime hf`, on a GPU or where the fused kernels could not be built keeps its own
weights; each option given explicitly wins (`;quant=none`, `;vocab=all`, `;window=all`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quickdraft.runtime import kernels
from quickdraft.runtime.choose import forces_reference
from quickdraft.runtime.quant.modes import QuantSpec

FAST_QUANT = "w4a8-all"
VOCAB = 32768
WINDOW = 256
MIN_PARAMS = 20_000_000
QUANT_DTYPES = (torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class DraftForm:
    """The draft's resolved form: its weights (None: as loaded), its head (`;vocab=` value; None: the
    whole head) and its prompt window (None: all of it)."""

    quant: QuantSpec | None
    vocab: str | None
    window: int | None


def fast_form(model: torch.nn.Module, vocab_size: int, runtime: str, device: str = "cpu") -> DraftForm:
    """The fast form of a draft `model` (module docstring) on `runtime`, for a vocabulary of `vocab_size`,
    drafting on `device` (the target's: a draft follows it there)."""
    params = sum(p.numel() for p in model.parameters())
    weight = next(model.parameters())
    cpu = weight.device.type == "cpu" and device == "cpu"
    quantizable = params >= MIN_PARAMS and weight.dtype in QUANT_DTYPES and cpu and not forces_reference(runtime)
    quantizable = quantizable and kernels.fused_ops() is not None  # no kernels built here: its own weights
    return DraftForm(
        quant=QuantSpec(FAST_QUANT) if quantizable else None,
        vocab=str(VOCAB) if params >= MIN_PARAMS and vocab_size > 2 * VOCAB else None,
        window=WINDOW if params >= MIN_PARAMS else None,
    )


def resolve(given: DraftForm, fast: DraftForm, unset: object) -> DraftForm:
    """`given` with each field left at `unset` taken from `fast`."""
    pick = lambda mine, auto: auto if mine is unset else mine  # noqa: E731
    return DraftForm(pick(given.quant, fast.quant), pick(given.vocab, fast.vocab), pick(given.window, fast.window))
