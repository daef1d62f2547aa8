"""How well a draft agrees with the target on held-out text, before any speculative decoding.

- expected acceptance: mean over scored tokens of sum_v min(p, q) (the speculative-sampling
  acceptance rate, for the processing given);
- greedy agreement: fraction of scored tokens where argmax q == argmax p (the greedy acceptance rate).

Held-out text comes from the ShareGPT records the training split leaves out, as reference responses
(``fixed``) and as responses sampled from the target (``target``: the contexts SD actually sees).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.training.data import Batch
from quickdraft.training.losses import LossProcessing, acceptance, processed_logprobs
from quickdraft.training.scoring import scored_logits


@dataclass
class AgreementReport:
    expected_acceptance: float
    greedy_agreement: float
    tokens: int

    def as_dict(self) -> dict:
        return {
            "expected_acceptance": round(self.expected_acceptance, 4),
            "greedy_agreement": round(self.greedy_agreement, 4),
            "tokens": self.tokens,
        }


@torch.no_grad()
def agreement(
    target,
    draft,
    batches: Sequence[Batch],
    proc: LossProcessing | None = None,
    head_ids: torch.Tensor | None = None,
) -> AgreementReport:
    """Expected acceptance and greedy agreement of `draft` (HF model) with `target` over batches.

    head_ids: (K,) token ids a restricted draft head keeps (q = 0 elsewhere, as CachedModel runs it
    in speculative decoding); None = the full head.
    """
    proc = proc or LossProcessing()
    acc_sum, agree, n = 0.0, 0, 0
    was = draft.training
    draft.eval()
    for batch in batches:
        p = scored_logits(target, batch)  # (N, V)
        q = scored_logits(draft, batch)
        V = min(p.shape[-1], q.shape[-1])
        p, q = p[:, :V].float(), q[:, :V].float()
        if head_ids is not None:
            keep = torch.full_like(q, float("-inf"))
            keep[:, head_ids] = 0.0
            q = q + keep
        acc_sum += float(acceptance(processed_logprobs(p, proc), processed_logprobs(q, proc)).sum())
        agree += int((p.argmax(-1) == q.argmax(-1)).sum())
        n += p.shape[0]
    draft.train(was)
    return AgreementReport(acc_sum / max(n, 1), agree / max(n, 1), n)
