"""Verifiers: pure functions (proposal, target probabilities, generator) -> Verdict.

A verifier is any callable `(draft_tokens (B,k), q_probs (B,k,V)|None, p_probs (B,k+1,V),
generator) -> Verdict` with attributes `name` and `lossy`. Verifiers know nothing of models or
caches.
"""

from __future__ import annotations

from typing import Protocol

import torch

from quickdraft.config import SamplingConfig
from quickdraft.errors import QuickdraftError
from quickdraft.types import Verdict
from quickdraft.verifiers.greedy import GreedyMatch, greedy_verify
from quickdraft.verifiers.speculative import SpeculativeSampling, speculative_verify


class Verifier(Protocol):
    name: str
    lossy: bool

    def __call__(
        self,
        draft_tokens: torch.Tensor,
        q_probs: torch.Tensor | None,
        p_probs: torch.Tensor,
        generator: torch.Generator | None,
    ) -> Verdict: ...


VERIFIERS: dict[str, type] = {"speculative": SpeculativeSampling, "greedy": GreedyMatch}


def make_verifier(name: str | None, sampling: SamplingConfig) -> Verifier:
    """Build a verifier by name; None picks greedy at temperature 0, speculative sampling otherwise."""
    if name is None:
        name = "greedy" if sampling.greedy else "speculative"
    if name not in VERIFIERS:
        raise QuickdraftError(f"unknown verifier {name!r}; choose one of {', '.join(VERIFIERS)}")
    if name == "greedy" and not sampling.greedy:
        raise QuickdraftError("the greedy verifier needs temperature 0")
    return VERIFIERS[name]()


__all__ = [
    "Verifier",
    "VERIFIERS",
    "make_verifier",
    "greedy_verify",
    "speculative_verify",
    "GreedyMatch",
    "SpeculativeSampling",
]
