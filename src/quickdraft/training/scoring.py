"""The one forward of training and evaluation: a causal LM's logits at the scored positions only."""

from __future__ import annotations

import torch

from quickdraft.training.data import Batch


def scored_logits(model, batch: Batch, head_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Run a causal LM over the batch and return logits only where scored: (N, V), or (N, K) over the
    K rows `head_ids` (K,) of its LM head (a restricted draft's own softmax).

    The LM head (the cost that dominates a small draft) is applied to the N scored positions only.
    """
    out = model.get_decoder()(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    )
    hidden = out.last_hidden_state[batch.loss_mask]  # (N, H)
    head = model.get_output_embeddings()
    if head_ids is None:
        return head(hidden)  # (N, V)
    return torch.nn.functional.linear(hidden, head.weight[head_ids.to(hidden.device)])  # (N, K)
