"""Shared pieces of every decode loop: seeded generators, the first (prefill) step and the handoff
of the target's states to a drafter that reads them.

Plain and speculative decoding share `prefill_step`, so the first generated token comes from the
same computation in both (mlx-lm PR #1109 fixed a divergence caused by two prefill paths).

The target's states travel explicitly (vLLM passes `target_hidden_states` to its proposer the same
way): a target forward returns one record (`types.TargetOutput`) holding the states the drafter
declared it reads (`Drafter.target_layers`), and the decoder passes the committed rows to the drafter
as an argument (`Drafter.observe`). The cache owner keeps only its cache.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import FEATURES, Drafter, bind_target
from quickdraft.runtime.target import Target
from quickdraft.sampling import greedy, gumbel_argmax, logits_to_probs
from quickdraft.types import Round, TargetOutput


@dataclass
class Generators:
    """The random draws of one request.

    `noise(position)` is the Gumbel noise that draws the target's token at an output position
    (`sampling.gumbel_argmax`), made from the seed and the position alone. So a seeded request
    draws the same token at a position whichever round, draft or batch reaches it: a drafter whose
    drafts carry no q rows (suffix, n-gram, MaG) gives exactly the text of plain decoding with the
    same seed, and so does every round that drafted nothing (`decoding/round.py`). The streams:
    `target` draws the rejection rule's uniforms, corrections and bonus tokens for drafts sampled
    from a q (model drafters); `draft` draws draft tokens.
    """

    target: torch.Generator
    draft: torch.Generator
    seed: int | None = None  # what they were made from (a worker process rebuilds them from it)
    _noise: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def from_seed(cls, seed: int | None, device: str | torch.device = "cpu") -> Generators:
        """Both streams from one seed (None: a fresh one), on `device` (the models' device: samples
        and uniforms are drawn where the probabilities are)."""
        seed = random.SystemRandom().randrange(2**62) if seed is None else seed
        return cls(
            target=torch.Generator(device=device).manual_seed(seed),
            draft=torch.Generator(device=device).manual_seed((seed * 1_000_003 + 7) % 2**63),
            seed=seed,
        )

    def noise(self, position: int, vocab: int, device: str | torch.device = "cpu") -> torch.Tensor:
        """(vocab,) float32 standard Gumbel noise of output `position` (0 = the first prompt token's),
        from the seed and the position alone; kept while the request runs near it."""
        g = self._noise.get(position)
        if g is None or g.shape[0] != vocab:
            stream = torch.Generator(device=device).manual_seed((self.seed * 0x9E3779B1 + 7919 * position) % 2**63)
            u = torch.rand(vocab, generator=stream, device=device)
            g = self._noise[position] = -torch.log(-torch.log(u))
            for old in [k for k in self._noise if k < position - 64]:
                del self._noise[old]
        return g

    def draws(self, probs: torch.Tensor, positions: Sequence[int]) -> list[int]:
        """The target's token drawn at each row's output position: Gumbel-max of the processed p rows
        (n, V) with each position's noise (`sampling.gumbel_argmax`)."""
        noise = torch.stack([self.noise(p, probs.shape[-1], probs.device) for p in positions])
        return gumbel_argmax(probs, noise).tolist()


def pick_token(logits: torch.Tensor, sampling: SamplingConfig, gens: Generators, position: int) -> int:
    """The token at output `position` from its logits row (V,): argmax when greedy, else a draw of
    the processed p with that position's noise (`Generators.noise`)."""
    if sampling.greedy:
        return int(greedy(logits))
    return gens.draws(logits_to_probs(logits, sampling)[None], [position])[0]


@dataclass
class StateHandoff:
    """The target's states a drafter reads, asked of each target forward and handed over explicitly.

    Attributes:
        drafter: the drafter (None, or one reading nothing: every call is a plain extend).
        layers: the drafter's `target_layers` (layer l = the state entering layer l, FEATURES = the
            final-normed rows the LM head reads); empty when it reads nothing.
    """

    drafter: Drafter | None = None
    layers: tuple[int, ...] = ()

    @classmethod
    def of(cls, drafter: Drafter | None, target) -> StateHandoff:
        """The handoff for `drafter` over `target` (a drafter that runs the target's own first layers,
        Kangaroo, is bound to it here; the target must keep states: the native runtime)."""
        bind_target(drafter, target)
        return cls(drafter, tuple(drafter.target_layers) if drafter is not None else ())

    def forward(self, target, tokens: Sequence[int], **extend_options) -> TargetOutput:
        """One target forward over `tokens`, returning the states the drafter reads."""
        if not self.layers:
            return TargetOutput(target.extend(tokens, **extend_options))
        keep = tuple(layer for layer in self.layers if layer != FEATURES)
        return target.forward(tokens, keep_hidden=keep, features=FEATURES in self.layers, **extend_options)

    def hand_over(self, out: TargetOutput, rows: int | Sequence[int]) -> None:
        """Pass the drafter the committed rows of `out`: the first `rows`, or those indices (a
        tree's root and accepted path)."""
        if self.layers:
            pick = slice(0, rows) if isinstance(rows, int) else torch.tensor(list(rows), dtype=torch.long)
            self.drafter.observe(out.rows(self.layers, pick))


def prefill_step(
    target: Target,
    prompt_ids: Sequence[int],
    sampling: SamplingConfig,
    gens: Generators,
    handoff: StateHandoff | None = None,
) -> Round:
    """Run the prompt through the target and pick the first new token; a target-reading drafter
    (`handoff`) gets the prompt's rows.

    Afterwards the target cache holds the prompt and the new token is in no cache (the invariant
    of every loop: the cache holds the committed sequence minus its last token).
    """
    start = time.perf_counter()
    handoff = handoff or StateHandoff()
    target.reset()
    out = handoff.forward(target, prompt_ids, last_only=True)
    handoff.hand_over(out, len(prompt_ids))
    token = pick_token(out.logits[-1], sampling, gens, len(prompt_ids))
    return Round(tokens=[token], verify_s=time.perf_counter() - start)
