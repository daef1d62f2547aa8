"""Train Kangaroo adapters, EAGLE-style feature heads and SpecDec block drafters on the SeqKD corpus
(`quickdraft train-draft`).

The frozen target's states of each corpus window (the native forward, exactly as at inference: the
exit-layer states, Kangaroo's input, and the final-normed features, the head's input and target)
are computed once into a memory-mapped store (`feature_store.py`) and read back every later epoch;
every requested module then takes one AdamW step on a batch:

- kangaroo: soft cross-entropy of q = softmax(head(adapter(h_l))) against p = the target's
  distribution at the same position (= forward KL(p||q) + const), as the paper trains it;
- head: the same against the target's distribution one position ahead, plus EAGLE's feature
  regression (smooth L1 between the predicted and the true next feature); with `ttt_steps` n > 1
  the head is unrolled n steps on its own predicted features, as it drafts (EAGLE-3's
  "training-time test"), and the losses of every step are averaged.

p and q live on the restricted head's K ids (the drafter drafts from those K rows only); held-out
evaluation scores q against the target's full distribution. Runs checkpoint every N steps and resume
(`train_run.py`).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from quickdraft.drafters.kinds import KINDS
from quickdraft.models.draft_heads import DraftHeadConfig, init_from_target
from quickdraft.runtime.forward.native import NativeLlama
from quickdraft.training.feature_store import FEATURES, Batch
from quickdraft.training.seqkd import response_mask


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
    ttt_steps: int = 1
    minutes: float = 0.0  # > 0: stop after this many minutes of training, the schedule stretched over them
    extra: dict = field(default_factory=dict)


@torch.no_grad()
def target_states(net: NativeLlama, ids: list[int], exit_layer: int | None) -> dict:
    """The frozen target over one window (the inference forward): {FEATURES: (T, H) final-normed
    features, exit_layer: (T, H) the states entering it}."""
    x = torch.tensor(ids, dtype=torch.long, device=net.device)
    out, kept = net.forward(net.new_cache(len(ids)), 0, x, keep_hidden=() if exit_layer is None else (exit_layer,))
    return {FEATURES: out, **({} if exit_layer is None else {exit_layer: kept[exit_layer]})}


@torch.no_grad()
def target_states_many(model, windows: list[list[int]], exit_layer: int | None) -> list[dict]:
    """The frozen target over several windows in one batched forward (Hugging Face's, right-padded:
    the causal mask keeps every real position's states independent of the padding), what a GPU
    fills the store with; one `target_states`-like dict per window, rows past its length included
    (the store keeps the first len(window))."""
    dev = next(model.parameters()).device
    ids = torch.zeros(len(windows), max(len(w) for w in windows), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b, w in enumerate(windows):
        ids[b, : len(w)] = torch.tensor(w)
        mask[b, : len(w)] = 1
    out = model.get_decoder()(
        input_ids=ids.to(dev), attention_mask=mask.to(dev), output_hidden_states=exit_layer is not None
    )
    feats = out.last_hidden_state  # (B, T, H), after the final norm
    kept = None if exit_layer is None else out.hidden_states[exit_layer]  # the states entering layer l
    return [{FEATURES: feats[b], **({} if kept is None else {exit_layer: kept[b]})} for b in range(len(windows))]


def module_states(module, batch: Batch, embed: torch.Tensor, steps: int = 1) -> list:
    """[(the module's states that the LM head reads (N, H), the target's features there (N, H),
    of_first)] at the N scored positions, one entry per unrolled step (`steps` > 1: the head only;
    its states are its predicted features). `of_first` (None for the first entry) says which of the
    first entry's target rows a later step's are: the target's distribution there is computed once.
    Rows that are not scored give keys and values only: the block's output projection, MLP and the
    LM head never run on them."""
    width = batch.ids.shape[1]
    dev, dtype = embed.device, next(module.parameters()).dtype
    feats = batch.feats.to(dev)
    if module.inputs == "shallow":  # Kangaroo's adapter
        mask = response_mask(batch.lengths, batch.prompt_lens, width).to(dev)
        z = module(batch.shallow.to(dev, dtype), torch.arange(width, device=dev), rows=mask)
        return [(z, feats[mask], None)]
    if module.inputs == "block":  # SpecDec's block drafter
        return [(*block_states(module, batch, embed, dtype), None)]
    return head_steps(module, batch, embed, steps)


def unrolled_mask(n: int, steps: int, device=None) -> torch.Tensor:
    """(steps*n, steps*n) bool attention of an unrolled head: block a holds step a+1's rows, row t
    of each block continuing origin t. A step-(a+1) row sees the true rows 0..t (step 1, causal)
    and its own origin's rows of steps 2..a+1: exactly what a drafting step sees in the head's
    cache (the committed rows, then its own draft rows)."""
    eye = torch.eye(n, dtype=torch.bool, device=device)
    mask = torch.zeros(steps * n, steps * n, dtype=torch.bool, device=device)
    for a in range(steps):
        mask[a * n : (a + 1) * n, :n] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        for b in range(1, a + 1):
            mask[a * n : (a + 1) * n, b * n : (b + 1) * n] = eye
    return mask


def head_steps(module, batch: Batch, embed: torch.Tensor, steps: int) -> list:
    """The head teacher-forced on true features (step 1: input (f_t, x_{t+1}) at position t predicts
    f_{t+1}, the distribution of x_{t+2}), then unrolled on its own predictions (step j: input
    (predicted f_{t+j-1}, x_{t+j}) at position t+j-1 predicts f_{t+j}). Every step's block runs
    over the rows of all steps so far under `unrolled_mask` (the block stays the inference block);
    earlier steps' rows give keys and values only. Returns `module_states`'s list, rows of each
    step in (batch, origin) order: step j's targets (positions t+j) are step 1's (positions t+1)
    from position j on, in the same (batch, position) order."""
    width = batch.ids.shape[1]
    n, dev, dtype = width - 1, embed.device, next(module.parameters()).dtype
    feats, ids = batch.feats.to(dev), batch.ids.to(dev)
    batch_size, origin = ids.shape[0], torch.arange(n, device=dev)
    fused: list[torch.Tensor] = []
    out, prev = [], feats[:, :-1].to(dtype)
    scored_first = torch.zeros(batch_size, width, dtype=torch.bool, device=dev)  # step 1's targets by position
    for j in range(1, steps + 1):
        at = (origin + j).clamp(max=width - 1)  # past the window: never scored
        fused.append(module.fuse(torch.cat((prev, embed[ids[:, at]].to(dtype)), -1)))
        valid = response_mask(batch.lengths, batch.prompt_lens, n, shift=j).to(dev)  # (B, n)
        last = torch.zeros(batch_size, j * n, dtype=torch.bool, device=dev)
        last[:, -n:] = valid if j == steps else True  # the next step reads every origin of this one
        positions = torch.cat([origin + i for i in range(j)])
        mask = None if j == 1 else unrolled_mask(n, j, dev)[None, None]
        pred = module.block(torch.cat(fused, 1), positions, None, mask, rows=last)
        if j == 1:
            scored_first[:, 1:] = valid
            of_first, target = None, feats[:, at][valid]
        else:
            scored = torch.zeros_like(scored_first)
            scored[:, j:] = valid[:, : width - j]
            of_first = scored[scored_first]
            target = out[0][1][of_first]
        if j < steps:
            pred = pred.view(batch_size, n, -1)
            out.append((pred[valid], target, of_first))
            prev = pred
        else:
            out.append((pred, target, of_first))
    return out


def block_states(module, batch: Batch, embed: torch.Tensor, dtype, cuts: int = 8):
    """SpecDec's block drafter, teacher-forced: prefix rows as the feature head's, and after `cuts`
    shared cut points t, `block` mask queries that see prefix rows <= t and their own cut's queries
    (bidirectionally). Query j of cut t drafts x_{t+2+j}, whose target distribution is the one at
    position t+1+j. Returns `module_states`'s pair (the scored queries' states)."""
    width, k = batch.ids.shape[1], module.cfg.block
    dev = embed.device
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
    target_pos = torch.tensor([t + 1 + j for t in ts for j in range(k)], device=dev)
    scored = response_mask(batch.lengths, batch.prompt_lens, width)[:, target_pos.cpu()].to(dev)  # (B, cuts*k)
    keep = torch.cat((torch.zeros(len(scored), n, dtype=torch.bool, device=dev), scored), 1)
    out = module.block(
        torch.cat((prefix, queries), 1), torch.tensor(positions, device=dev), None, mask.to(dev)[None, None], keep
    )
    return out, feats[:, target_pos][scored]


def train_loss(module, batch: Batch, embed, head, feature_weight: float, steps: int = 1) -> tuple[torch.Tensor, dict]:
    """Soft cross-entropy against the target's restricted p (+ feature regression for the head),
    averaged over the unrolled steps; stats name step j's figures with the suffix j (j > 1)."""
    total, stats, first_p = 0.0, {}, None
    outputs = module_states(module, batch, embed, steps)
    for j, (rows, target, of_first) in enumerate(outputs, start=1):
        if not len(rows):
            continue
        logits = F.linear(rows, head.to(rows.dtype))  # (N, K)
        if of_first is None:
            p = first_p = F.softmax(F.linear(target, head.to(target.dtype)).float(), dim=-1)
        else:
            p = first_p[of_first]
        logq = F.log_softmax(logits.float(), dim=-1)
        loss = -(p * logq).sum(-1).mean()
        tag = "" if j == 1 else str(j)
        stats["ce" + tag] = float(loss.detach())
        if module.regresses_features:  # EAGLE's feature regression (the block drafter predicts no features)
            reg = F.smooth_l1_loss(rows.float(), target.float())
            loss = loss + feature_weight * reg
            stats["feat" + tag] = float(reg.detach())
        with torch.no_grad():  # argmax in float32 (bf16's is slower on CPU)
            stats["agree" + tag] = float((logq.argmax(-1) == p.argmax(-1)).float().mean())
        total = total + loss
    return total / len(outputs), stats


@torch.no_grad()
def evaluate(module, batches: list[Batch], embed, full_head, head_ids, steps: int = 1) -> dict:
    """Held-out, teacher-forced (the block drafter: its queries at random cuts): greedy agreement
    with the target's full-vocabulary argmax and expected acceptance sum_v min(p, q) at T=1 (q is
    zero off the restricted ids). With `steps` > 1 (the head) also step j's agreement when it runs
    on its own predicted features (`greedy_agreement_j`): on greedy rows, the chance that drafted
    token j is accepted given the ones before it were."""
    agree, accept, count = [0.0] * steps, 0.0, [0.0] * steps
    sub = full_head[head_ids]
    with torch.random.fork_rng(devices=[]):  # training's RNG stream is left as it was
        torch.manual_seed(0)  # the block drafter's cuts: the same held-out positions at every eval
        for batch in batches:
            outputs = module_states(module, batch, embed, steps if module.unrolls else 1)
            for j, (rows, target, of_first) in enumerate(outputs):
                logits = F.linear(rows, sub.to(rows.dtype))  # (N, K)
                if of_first is None:
                    target_logits = first = F.linear(target, full_head)  # (N, V)
                else:
                    target_logits = first[of_first]
                if j == 0:
                    p = F.softmax(target_logits.float(), dim=-1)
                    q_sub = F.softmax(logits.float(), dim=-1)
                    accept += float(torch.minimum(p[:, head_ids], q_sub).sum())
                agree[j] += float((head_ids[logits.argmax(-1)] == target_logits.argmax(-1)).sum())
                count[j] += float(len(logits))
    out = {"greedy_agreement": agree[0] / count[0], "expected_acceptance_t1": accept / count[0]}
    out.update({f"greedy_agreement_{j + 1}": agree[j] / count[j] for j in range(1, steps) if count[j]})
    return {**out, "positions": int(count[0])}


def new_module(kind: str, target_model, cfg: HeadTrainingConfig) -> torch.nn.Module:
    head_cfg = DraftHeadConfig.from_target(target_model, kind, cfg.exit_layer, cfg.block)
    module = KINDS[kind].module(head_cfg)
    layers = int(target_model.config.num_hidden_layers)
    init_from_target(module, target_model, module.init_layer(layers))
    return module.float()


def lr_at(step: int, cfg: HeadTrainingConfig, spent: float | None = None) -> float:
    """Linear warm-up, then cosine decay to a tenth, over the steps or, with a time budget
    (`cfg.minutes`), over the fraction `spent` of it."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = spent if spent is not None else (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def batch_indices(count: int, step: int, batch_size: int, seed: int) -> list[int]:
    """The window indices of training step `step` (a fixed shuffled order per pass over `count`
    windows, so a resumed run sees the same data it would have seen)."""
    start = step * batch_size
    epoch, offset = divmod(start, count)
    order = list(range(count))
    random.Random(seed * 1000 + epoch).shuffle(order)
    return [order[(offset + i) % count] for i in range(batch_size)]
