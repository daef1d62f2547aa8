"""Verifiers: pure functions (proposal, target probabilities, generator) -> Verdict.

A verifier (`verifiers/base.py`) is a callable `(draft_tokens (B,k), q_probs (B,k,V)|None, p_probs
(B,k+1,V), generator) -> Verdict` declaring `name`, `lossy` and `reads_logits`. Verifiers know
nothing of models or caches.

One greedy rule and one sampling rule, both over token trees (`verifiers/tree.py`: `follow_greedy`,
`verify_tree_sampling`); a chain is a one-wide tree, so `greedy_verify` and `speculative_verify`
only lay a batch of chains out as paths and call them. The lossy rules stay named rules beside
them: `lenient:L` (DistillSpec) and `specdec` (SpecDec's Spec-Verification).
"""

from __future__ import annotations

from quickdraft.config import SamplingConfig
from quickdraft.errors import QuickdraftError
from quickdraft.verifiers.base import TreeRule, Verifier
from quickdraft.verifiers.greedy import GreedyMatch, greedy_verify
from quickdraft.verifiers.lenient import LenientVerifier, lenient_verify
from quickdraft.verifiers.specdec import SpecVerifier, parse_specdec, spec_verify
from quickdraft.verifiers.speculative import SpeculativeSampling, speculative_verify

VERIFIERS: dict[str, type] = {"speculative": SpeculativeSampling, "greedy": GreedyMatch, "lenient": LenientVerifier}


def make_verifier(name: str | None, sampling: SamplingConfig) -> Verifier:
    """Build a verifier by name; None picks greedy at temperature 0, speculative sampling otherwise."""
    if name is None:
        name = "greedy" if sampling.greedy else "speculative"
    kind, _, arg = name.partition(":")
    if kind == "specdec":
        if not sampling.greedy:
            raise QuickdraftError("Spec-Verification (specdec) is deterministic: it needs temperature 0")
        return parse_specdec(arg)
    if kind not in VERIFIERS or (arg and kind != "lenient"):
        raise QuickdraftError(
            f"unknown verifier {name!r}; choose one of greedy, speculative, lenient[:L] (lossy), "
            "specdec[:beta=B,tau=T] (lossy when beta > 1)"
        )
    if kind == "greedy" and not sampling.greedy:
        raise QuickdraftError("the greedy verifier needs temperature 0")
    if kind == "lenient":
        if sampling.greedy:
            raise QuickdraftError("lenient verification relaxes the sampling test and does nothing at temperature 0")
        try:
            lenience = float(arg) if arg else 0.5
        except ValueError:
            raise QuickdraftError(
                f"lenient verifier needs a number in (0, 1], e.g. lenient:0.5 (got {arg!r})"
            ) from None
        return LenientVerifier(lenience)
    return VERIFIERS[kind]()


__all__ = [
    "TreeRule",
    "Verifier",
    "VERIFIERS",
    "make_verifier",
    "greedy_verify",
    "speculative_verify",
    "GreedyMatch",
    "LenientVerifier",
    "lenient_verify",
    "SpeculativeSampling",
    "SpecVerifier",
    "spec_verify",
]
