"""Train Kangaroo adapters and EAGLE-style feature heads on the SeqKD corpus (`quickdraft train-draft`).

One frozen target pass per batch (the native forward, exactly as at inference) yields both the
exit-layer states (Kangaroo's input) and the final-normed features (the head's input and target);
every requested module then takes one AdamW step on it:

- kangaroo: soft cross-entropy of q = softmax(head(adapter(h_l))) against p = the target's
  distribution at the same position (= forward KL(p||q) + const), as the paper trains it;
- head: the same against the target's distribution one position ahead, plus EAGLE's feature
  regression (smooth L1 between the predicted and the true next feature).

p and q live on the restricted head's K ids (the drafter drafts from those K rows only); held-out
evaluation scores q against the target's full distribution. Runs checkpoint every N steps and resume.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from quickdraft.distill.seqkd import Row, response_mask, window
from quickdraft.drafters.kinds import KINDS
from quickdraft.models.draft_heads import DraftHeadConfig, init_from_target
from quickdraft.models.native import NativeLlama


@dataclass
class HeadTrainingConfig:
    """What `train-draft` trains and how (defaults: the shipped modules' recipe)."""

    kinds: tuple[str, ...] = ("head",)
    steps: int = 1000
    batch_size: int = 8
    max_len: int = 256
    lr: float = 1e-3
    warmup: int = 40
    exit_layer: int = 2
    block: int = 4
    head_vocab: int = 8192
    feature_weight: float = 1.0
    checkpoint_every: int = 50
    seed: int = 0
    extra: dict = field(default_factory=dict)


@dataclass
class Batch:
    """Padded target states of B corpus windows: ids (B, T), feats and shallow (B, T, H)."""

    ids: torch.Tensor
    lengths: list[int]
    prompt_lens: list[int]
    feats: torch.Tensor
    shallow: torch.Tensor | None


@torch.no_grad()
def target_batch(net: NativeLlama, rows: list[Row], max_len: int, exit_layer: int | None) -> Batch:
    """Run the frozen target on each row's window (one sequence at a time, the inference forward)."""
    windows = [window(r, max_len) for r in rows]
    width = max(len(ids) for ids, _ in windows)
    hidden = net.embed.shape[1]
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    feats = torch.zeros(len(rows), width, hidden, dtype=net.dtype)
    shallow = None if exit_layer is None else torch.zeros_like(feats)
    cache = net.new_cache(width)
    for b, (seq, _) in enumerate(windows):
        x = torch.tensor(seq, dtype=torch.long, device=net.device)
        out, kept = net.forward(cache, 0, x, keep_hidden=() if exit_layer is None else (exit_layer,))
        ids[b, : len(seq)] = x.cpu()
        feats[b, : len(seq)] = out.cpu()
        if shallow is not None:
            shallow[b, : len(seq)] = kept[exit_layer].cpu()
    return Batch(ids, [len(s) for s, _ in windows], [p for _, p in windows], feats, shallow)


def module_logits(module, kind: str, batch: Batch, embed: torch.Tensor, head: torch.Tensor):
    """(logits (B, T', K) of q, aligned target features (B, T', H), mask (B, T'), predicted features)."""
    width = batch.ids.shape[1]
    dev, dtype = head.device, next(module.parameters()).dtype
    if kind == "kangaroo":
        positions = torch.arange(width, device=dev)
        z = module(batch.shallow.to(dev, dtype), positions)
        logits = F.linear(z, head.to(z.dtype))
        return logits, batch.feats.to(dev), response_mask(batch.lengths, batch.prompt_lens, width), z
    if kind == "specdec":
        return block_logits(module, batch, embed, head, dtype)
    # head: input (f_t, x_{t+1}) predicts f_{t+1}, whose distribution is over x_{t+2}
    positions = torch.arange(width - 1, device=dev)
    feats = batch.feats.to(dev)
    pred = module(feats[:, :-1].to(dtype), embed[batch.ids[:, 1:].to(dev)].to(dtype), positions)
    mask = response_mask(batch.lengths, batch.prompt_lens, width - 1, shift=1)
    return F.linear(pred, head.to(pred.dtype)), feats[:, 1:], mask, pred


def block_logits(module, batch: Batch, embed: torch.Tensor, head: torch.Tensor, dtype, cuts: int = 8):
    """SpecDec's block drafter, teacher-forced: prefix rows as the feature head's, and after `cuts`
    shared cut points t, `block` mask queries that see prefix rows <= t and their own cut's queries
    (bidirectionally). Query j of cut t drafts x_{t+2+j}, whose target distribution is the one at
    position t+1+j. Returns the same 4-tuple as `module_logits` (no predicted features)."""
    width, k = batch.ids.shape[1], module.cfg.block
    dev = head.device
    feats = batch.feats.to(dev)
    prefix = module.fuse(torch.cat((feats[:, :-1].to(dtype), embed[batch.ids[:, 1:].to(dev)].to(dtype)), -1))
    n = width - 1  # prefix rows t = 0..n-1
    last = max(1, n - k)  # cut t needs targets at t+1..t+k < width
    ts = torch.randint(0, last, (cuts,)).tolist()  # fresh cuts every call (the global RNG)
    rows = n + cuts * k
    mask = torch.zeros(rows, rows, dtype=torch.bool)
    mask[:n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
    positions = list(range(n))
    for c, t in enumerate(ts):
        r = n + c * k
        mask[r : r + k, : t + 1] = True
        mask[r : r + k, r : r + k] = True
        positions += [t + 1 + j for j in range(k)]
    queries = (
        module.queries.to(dtype)[None].expand(cuts, k, -1).reshape(1, cuts * k, -1).expand(prefix.shape[0], -1, -1)
    )
    out = module.block(
        torch.cat((prefix, queries), 1), torch.tensor(positions, device=dev), None, mask.to(dev)[None, None]
    )
    q_out = out[:, n:]  # (B, cuts*k, H)
    target_pos = torch.tensor([t + 1 + j for t in ts for j in range(k)], device=dev)
    full = response_mask(batch.lengths, batch.prompt_lens, width)  # (B, width)
    return F.linear(q_out, head.to(q_out.dtype)), feats[:, target_pos], full[:, target_pos.cpu()], None


def train_loss(module, kind: str, batch: Batch, embed, head, feature_weight: float) -> tuple[torch.Tensor, dict]:
    """Soft cross-entropy against the target's restricted p (+ feature regression for the head)."""
    logits, target_feats, mask, pred = module_logits(module, kind, batch, embed, head)
    mask = mask.to(logits.device)
    with torch.no_grad():
        p = F.softmax(F.linear(target_feats, head).float(), dim=-1)
    logq = F.log_softmax(logits.float(), dim=-1)
    ce = -(p * logq).sum(-1)
    loss = (ce * mask).sum() / mask.sum()
    stats = {"ce": float(loss.detach())}
    if kind == "head":  # EAGLE's feature regression (the block drafter predicts no features)
        reg = F.smooth_l1_loss(pred.float(), target_feats.float(), reduction="none").mean(-1)
        reg = (reg * mask).sum() / mask.sum()
        loss = loss + feature_weight * reg
        stats["feat"] = float(reg.detach())
    agree = (logits.argmax(-1) == p.argmax(-1)) & mask
    stats["agree"] = float(agree.sum() / mask.sum())
    return loss, stats


@torch.no_grad()
def evaluate(module, kind: str, batches: list[Batch], embed, full_head, head_ids) -> dict:
    """Held-out, teacher-forced (the block drafter: its queries at random cuts): greedy agreement
    with the target's full-vocabulary argmax and expected acceptance sum_v min(p, q) at T=1 (q is
    zero off the restricted ids)."""
    agree = accept = count = 0.0
    sub = full_head[head_ids]
    torch.manual_seed(0)  # the block drafter's cuts: the same held-out positions before and after
    for batch in batches:
        logits, target_feats, mask, _ = module_logits(module, kind, batch, embed, sub)
        p = F.softmax(F.linear(target_feats, full_head).float(), dim=-1)  # (B, T', V)
        q_sub = F.softmax(logits.float(), dim=-1)
        accept += float((torch.minimum(p[..., head_ids], q_sub).sum(-1) * mask).sum())
        agree += float(((head_ids[logits.argmax(-1)] == p.argmax(-1)) & mask).sum())
        count += float(mask.sum())
    return {"greedy_agreement": agree / count, "expected_acceptance_t1": accept / count, "positions": int(count)}


def decode_eval(module, kind: str, target, head_ids, prompts: list[list[int]], max_new_tokens: int = 48) -> dict:
    """Greedy speculative decoding with a copy of `module` (in the target's dtype) on held-out
    prompts: tokens per target forward (the bonus token included) and draft acceptance."""
    import copy

    from quickdraft.config import SamplingConfig, StopConfig
    from quickdraft.drafters.reuse import HeadLM
    from quickdraft.engine import Engine
    from quickdraft.options import options_from

    draft = copy.deepcopy(module).to(target.model.dtype).eval().requires_grad_(False)
    lm = HeadLM(
        target.model.get_input_embeddings().weight.detach(),
        target.model.get_output_embeddings().weight.detach(),
        target.vocab_size,
        head_ids,
    )
    record = KINDS[kind]
    drafter = record.from_module(draft, lm, 0.6, kind)
    config = options_from({"method": "sd", "drafter": kind, "draft_length": record.decode_length})
    engine = Engine(target, config, drafter=drafter)
    tokens = forwards = drafted = accepted = 0
    for ids in prompts:
        stats = engine.generate_ids(ids, SamplingConfig(temperature=0.0), StopConfig(max_new_tokens)).stats
        tokens += stats.num_new_tokens
        forwards += stats.num_target_forwards
        drafted += stats.num_draft_tokens
        accepted += stats.num_accepted_draft_tokens
    return {
        "tokens_per_target_forward": tokens / max(1, forwards),
        "draft_acceptance": accepted / max(1, drafted),
        "draft_length": record.decode_length,
        "prompts": len(prompts),
        "max_new_tokens": max_new_tokens,
    }


def new_module(kind: str, target_model, cfg: HeadTrainingConfig) -> torch.nn.Module:
    head_cfg = DraftHeadConfig.from_target(target_model, kind, cfg.exit_layer, cfg.block)
    module = KINDS[kind].module(head_cfg)
    layers = int(target_model.config.num_hidden_layers)
    init_from_target(module, target_model, cfg.exit_layer if kind == "kangaroo" else layers - 1)
    return module.float()


def lr_at(step: int, cfg: HeadTrainingConfig) -> float:
    """Linear warm-up, then cosine decay to a tenth."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def batch_rows(rows: list[Row], step: int, batch_size: int, seed: int) -> list[Row]:
    """The rows of training step `step` (a fixed shuffled order per pass, so a resumed run sees the
    same data it would have seen)."""
    start = step * batch_size
    epoch, offset = divmod(start, len(rows))
    order = list(range(len(rows)))
    random.Random(seed * 1000 + epoch).shuffle(order)
    picked = [order[(offset + i) % len(rows)] for i in range(batch_size)]
    return [rows[i] for i in picked]


def save_checkpoint(path: Path, step: int, modules: dict, optims: dict, history: list) -> None:
    state = {
        "step": step,
        "modules": {k: m.state_dict() for k, m in modules.items()},
        "optims": {k: o.state_dict() for k, o in optims.items()},
        "history": history,
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)
