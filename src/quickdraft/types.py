"""Small result records passed between drafters, verifiers and decode loops."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch


@dataclass
class TargetOutput:
    """What one target forward returns: its logits and the states a target-reading drafter declared
    it reads (`Drafter.target_layers`), for every row of the forward.

    Attributes:
        logits: (n, V) logits of the forward's rows ((1, V) when only the last row was asked for).
        hidden: {layer l: (n, H) the states entering layer l} for the layers asked for.
        features: (n, H) the final-normed states the LM head reads, or None when not asked for.
    """

    logits: torch.Tensor
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)
    features: torch.Tensor | None = None

    def rows(self, layers: tuple[int, ...], pick: slice | torch.Tensor) -> dict[int, torch.Tensor]:
        """{layer: the picked rows (m, H)} of `layers` (-1 = the features): the committed rows a
        drafter observes (a prefix of a chain's rows, or a tree's root and accepted path)."""
        return {layer: (self.features if layer == -1 else self.hidden[layer])[pick] for layer in layers}


@dataclass
class Verdict:
    """A verifier's decision for a batch of proposals.

    Attributes:
        num_accepted: (B,) int64, how many leading draft tokens were accepted.
        next_tokens: (B,) int64, the correction token (at the first rejection) or the bonus token
            (after all k drafts were accepted), drawn from the target.
    """

    num_accepted: torch.Tensor
    next_tokens: torch.Tensor


@dataclass
class Round:
    """One draft/verify round of a decode loop (before EOS/stop/budget truncation).

    Attributes:
        tokens: tokens committed this round: accepted drafts then the next token.
        num_draft_tokens: how many tokens were proposed (0 for a plain decoding step).
        num_accepted: how many of them were accepted.
        draft_s: seconds spent drafting; verify_s: seconds spent in the target forward + verifier.
    """

    tokens: list[int]
    num_draft_tokens: int = 0
    num_accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    events: dict[str, int] = field(default_factory=dict)  # method-specific counters, summed in stats
    draft_depth: int | None = None  # a tree's depth: acceptance "by position" is by depth for trees


@dataclass
class SpecStats:
    """Statistics of one generation, with vLLM's names where they exist.

    `mean_acceptance_length` is vLLM's: 1 + accepted / drafts, i.e. tokens per verification
    step including the bonus/correction token (Spec-Bench's "mean accepted tokens").
    `tokens_per_target_forward` also counts the prefill forward and drafts-free steps.
    """

    num_new_tokens: int = 0
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    num_target_forwards: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_lengths: list[int] = field(default_factory=list)  # tokens committed per target forward
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    wall_s: float = 0.0
    cached_prompt_tokens: int = 0  # prompt tokens a kept prefix held (no forward: the server's prefix store)
    kv_cache_bytes: int = 0  # the most KV cache bytes this generation held at a round's end (target + draft model)
    lossy: bool = False
    verifier: str = ""  # the verifier's name ("" for plain decoding)
    ran: dict[str, str] = field(default_factory=dict)  # method, drafter (as resolved), target, weights, runtime, device
    extra: dict[str, int] = field(default_factory=dict)  # method-specific counters (e.g. PEARL runs)

    @property
    def draft_acceptance_rate(self) -> float:
        return self.num_accepted_draft_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.num_accepted_draft_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def tokens_per_target_forward(self) -> float:
        return self.num_new_tokens / self.num_target_forwards if self.num_target_forwards else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.num_new_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def acceptance_rate_per_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position, strict=True)]

    def to_dict(self) -> dict:
        out = asdict(self)
        for name in (
            "draft_acceptance_rate",
            "mean_acceptance_length",
            "tokens_per_target_forward",
            "tokens_per_s",
            "acceptance_rate_per_position",
        ):
            out[name] = getattr(self, name)
        return out


@dataclass
class GenerationResult:
    """One finished generation.

    Attributes:
        text: decoded new text ("" when no tokenizer), cut before a stop string.
        token_ids: new token ids, the terminating EOS included.
        finish_reason: "stop" (EOS or stop string) or "length" (max_new_tokens).
        stats: the generation's statistics.
    """

    text: str
    token_ids: list[int]
    finish_reason: str
    stats: SpecStats

    def to_dict(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_dict(),
        }
