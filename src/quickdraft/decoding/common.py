"""Shared pieces of every decode loop: seeded generators and the first (prefill) step.

Plain and speculative decoding share `prefill_step`, so the first generated token comes from the
same computation in both (mlx-lm PR #1109 fixed a divergence caused by two prefill paths).
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.config import SamplingConfig
from quickdraft.models.cached_model import CachedModel
from quickdraft.sampling import greedy, logits_to_probs, sample
from quickdraft.types import Round


@dataclass
class Generators:
    """Independent random streams of one request: `target` draws plain samples, acceptance
    uniforms, corrections and bonus tokens; `draft` draws draft tokens."""

    target: torch.Generator
    draft: torch.Generator
    seed: int | None = None  # what they were made from (a worker process rebuilds them from it)

    @classmethod
    def from_seed(cls, seed: int | None) -> Generators:
        seed = random.SystemRandom().randrange(2**62) if seed is None else seed
        return cls(
            target=torch.Generator().manual_seed(seed),
            draft=torch.Generator().manual_seed((seed * 1_000_003 + 7) % 2**63),
            seed=seed,
        )


def pick_token(logits: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None) -> int:
    """One token from one logits row (V,): argmax when greedy, else a sample of the processed p."""
    if sampling.greedy:
        return int(greedy(logits))
    return int(sample(logits_to_probs(logits, sampling), generator))


def prefill_step(
    target: CachedModel,
    prompt_ids: Sequence[int],
    sampling: SamplingConfig,
    generator: torch.Generator,
    keep_hidden: Sequence[int] = (),
) -> Round:
    """Run the prompt through the target and pick the first new token (`keep_hidden`: the target
    layers whose states a target-reading drafter observes; native runtime only).

    Afterwards the target cache holds the prompt and the new token is in no cache (the invariant
    of every loop: the cache holds the committed sequence minus its last token).
    """
    start = time.perf_counter()
    logits = (target.prefill(prompt_ids, keep_hidden=keep_hidden) if keep_hidden else target.prefill(prompt_ids))[-1]
    token = pick_token(logits, sampling, generator)
    return Round(tokens=[token], verify_s=time.perf_counter() - start)
