"""Cached distillation data: training sequences with the target's top-k log-probabilities.

On a CPU the frozen target's forward (and, for SeqKD, its generation) costs more than the small
draft's training step. `build_cache` pays it once: it writes the sequences of one data generator
(``fixed`` references or ``target`` generations) together with the target's top-k next-token
log-probabilities at every scored position, in resumable shards. `CachedData` then serves batches
for as many epochs as wanted, and `topk_fkl` is the forward KL on that sparse target.

Shard layout (``shard-NNNNN.safetensors``, one per `shard_size` examples, in example order):

- ``tokens`` (S_tok,) int32: the sequences, concatenated; ``seq_offsets`` (S+1,) int64;
- ``prompt_lens`` (S,) int64: the first scored position of sequence s is prompt_lens[s] - 1;
- ``top_ids`` (N, k) int32 and ``top_logp`` (N, k) float32: the target's k most likely next tokens
  and their log-probabilities (temperature 1, full vocabulary) at the N scored positions, in
  sequence order.

The cached law is p_k: p restricted to its top k and renormalised (the rest of p, usually a few
percent of mass, is dropped). `topk_divergence` trains q towards it with FKL, JSD or TVD, exactly
and without vocabulary-wide passes.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from quickdraft.errors import QuickdraftError
from quickdraft.training.data import Batch, Example, FixedData, Sampled, _response_scored, collate
from quickdraft.training.losses import parse_divergence
from quickdraft.training.scoring import scored_logits
from quickdraft.training.seqkd import hard_labels

CACHE_META = "cache.json"


@dataclass
class CacheSpec:
    """What a cache holds; a cache folder is only extended with the same spec."""

    source: str  # fixed | target
    max_response_tokens: int = 96
    top_k: int = 32
    gen_temperature: float = 0.0
    shard_size: int = 64
    target: str = ""

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def _write_shard(path: Path, batch: Batch, p_logits: torch.Tensor, top_k: int) -> int:
    """Store one batch and the target's top-k at its scored positions; returns the scored count."""
    logp = torch.log_softmax(p_logits.float(), dim=-1)  # (N, V)
    top = torch.topk(logp, top_k, dim=-1)
    seqs, prompt_lens = [], []
    for b in range(batch.input_ids.shape[0]):
        keep = batch.attention_mask[b].bool()
        ids = batch.input_ids[b][keep]
        scored = batch.loss_mask[b][keep].nonzero()
        seqs.append(ids)
        prompt_lens.append(int(scored[0]) + 1 if len(scored) else len(ids))
    offsets = torch.tensor([0] + [len(s) for s in seqs]).cumsum(0)
    tmp = path.with_suffix(".tmp")
    save_file(
        {
            "tokens": torch.cat(seqs).to(torch.int32),
            "seq_offsets": offsets.to(torch.int64),
            "prompt_lens": torch.tensor(prompt_lens, dtype=torch.int64),
            "top_ids": top.indices.to(torch.int32).contiguous(),
            "top_logp": top.values.contiguous(),
        },
        str(tmp),
    )
    tmp.rename(path)
    return int(p_logits.shape[0])


def build_cache(
    target,
    examples: Sequence[Example],
    folder: Path,
    spec: CacheSpec,
    pad_id: int,
    eos_ids: set[int],
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Write (or finish writing) the cache of `examples` under `folder`; returns the folder.

    Args:
        target: the frozen target LoadedModel (float32 recommended on CPU).
        examples: prompts (and references for ``fixed``), in a fixed order: shard i holds examples
            [i*shard_size, (i+1)*shard_size), so an interrupted build resumes at the first missing shard.
    """

    if spec.source not in ("fixed", "target"):
        raise QuickdraftError(f"a cache holds 'fixed' or 'target' data, got {spec.source!r}")
    if spec.top_k < 1:
        raise QuickdraftError("cache top_k must be >= 1")
    folder.mkdir(parents=True, exist_ok=True)
    meta_path = folder / CACHE_META
    if meta_path.is_file():
        old = json.loads(meta_path.read_text())["spec"]
        if old != spec.as_dict():
            raise QuickdraftError(f"{folder} holds a cache built with other options ({old}); use another folder")
    meta_path.write_text(json.dumps({"spec": spec.as_dict()}, indent=2) + "\n")
    gen = (
        FixedData(spec.max_response_tokens)
        if spec.source == "fixed"
        else Sampled("target", spec.max_response_tokens, spec.gen_temperature)
    )
    model = target.model.eval()
    n_shards = (len(examples) + spec.shard_size - 1) // spec.shard_size
    bar = tqdm(total=n_shards, desc=f"cache {spec.source}", disable=not progress, dynamic_ncols=True)
    for i in range(n_shards):
        path = folder / f"shard-{i:05d}.safetensors"
        if path.is_file():
            bar.update(1)
            continue
        chunk = examples[i * spec.shard_size : (i + 1) * spec.shard_size]
        parts = []
        for j in range(0, len(chunk), batch_size):
            batch = gen.make(
                chunk[j : j + batch_size],
                pad_id,
                target=model,
                draft=None,
                eos_ids=eos_ids,
                generator_seed=seed * 1_000_003 + i * 1009 + j,
            )
            with torch.no_grad():
                parts.append((batch, scored_logits(model, batch)))
        shard_batch = _concat(parts, pad_id)
        _write_shard(path, shard_batch, torch.cat([p for _, p in parts]), spec.top_k)
        bar.update(1)
    bar.close()
    return folder


def _concat(parts: list[tuple[Batch, torch.Tensor]], pad_id: int) -> Batch:
    """Re-collate several batches into one (sequence order kept, so scored rows stay aligned)."""
    seqs, scored = [], []
    for batch, _ in parts:
        for b in range(batch.input_ids.shape[0]):
            keep = batch.attention_mask[b].bool()
            seqs.append(batch.input_ids[b][keep].tolist())
            scored.append(batch.loss_mask[b][keep].tolist())
    return collate(seqs, scored, pad_id, parts[0][0].source)


class CachedData:
    """All shards of one or more cache folders, in memory; `batch(rng, n)` draws n sequences. A folder
    of SeqKD shards (the target's greedy outputs, `scripts/target_corpus.py`) is read as its top 1.

    Attributes:
        source: the generator the cache(s) hold ("fixed", "target" or "fixed+target").
    """

    def __init__(self, folders: Sequence[Path]):
        self.sequences: list[list[int]] = []
        self.prompt_lens: list[int] = []
        self.top_ids: list[torch.Tensor] = []  # per sequence (n_s, k)
        self.top_logp: list[torch.Tensor] = []
        sources, ks = [], set()
        for folder in folders:
            folder = Path(folder)
            if not (folder / CACHE_META).is_file() and any(folder.glob("seqkd-*.jsonl.gz")):
                seqs, plens, ids, logp = hard_labels(folder)  # the target's own greedy outputs: its top 1
                self.sequences += seqs
                self.prompt_lens += plens
                self.top_ids += ids
                self.top_logp += logp
                sources.append("target")
                ks.add(1)
                continue
            if not (folder / CACHE_META).is_file():
                raise QuickdraftError(f"{folder} is not a distillation cache (no {CACHE_META}); build one first")
            spec = json.loads((folder / CACHE_META).read_text())["spec"]
            sources.append(spec["source"])
            shards = sorted(folder.glob("shard-*.safetensors"))
            if not shards:
                raise QuickdraftError(f"cache {folder} has no shards yet")
            for shard in shards:
                t = load_file(str(shard))
                ks.add(int(t["top_ids"].shape[1]))
                off, row = t["seq_offsets"].tolist(), 0
                for s in range(len(off) - 1):
                    ids = t["tokens"][off[s] : off[s + 1]].tolist()
                    n = len(ids) - int(t["prompt_lens"][s])
                    self.sequences.append(ids)
                    self.prompt_lens.append(int(t["prompt_lens"][s]))
                    self.top_ids.append(t["top_ids"][row : row + n].long())
                    self.top_logp.append(t["top_logp"][row : row + n])
                    row += n
                if row != t["top_ids"].shape[0]:
                    raise QuickdraftError(f"{shard} is inconsistent: {row} scored rows expected")
        if len(ks) > 1:
            raise QuickdraftError(f"caches with different top_k {sorted(ks)} cannot be mixed")
        self.source = "+".join(dict.fromkeys(sources))

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def num_scored(self) -> int:
        return sum(t.shape[0] for t in self.top_ids)

    def batch(self, rng: random.Random, n: int, pad_id: int) -> tuple[Batch, torch.Tensor, torch.Tensor]:
        """n random sequences: (Batch, top_ids (N, k), top_logp (N, k)), rows in the batch's scored order."""
        idx = [rng.randrange(len(self.sequences)) for _ in range(n)]
        seqs = [self.sequences[i] for i in idx]
        scored = [_response_scored(self.prompt_lens[i], len(self.sequences[i]) - self.prompt_lens[i]) for i in idx]
        batch = collate(seqs, scored, pad_id, self.source)
        ids = torch.cat([self.top_ids[i] for i in idx])
        logp = torch.cat([self.top_logp[i] for i in idx])
        if ids.shape[0] != batch.num_scored:
            raise QuickdraftError(f"cache rows ({ids.shape[0]}) do not match scored positions ({batch.num_scored})")
        return batch, ids, logp


def parse_topk_divergence(divergence: str) -> tuple[str, float]:
    """'fkl' | 'tvd' | 'jsd[:BETA]' -> (name, beta); other divergences cannot use a cached top k."""
    name, beta = parse_divergence(divergence)
    if name not in ("fkl", "tvd", "jsd"):
        raise QuickdraftError(
            f"divergence {divergence!r} cannot be trained on a cached top k: use fkl, jsd[:BETA] or tvd "
            "(KL(q || p_k) is infinite)"
        )
    return name, beta


def topk_divergence(
    top_ids: torch.Tensor,
    top_logp: torch.Tensor,
    q_logits: torch.Tensor,
    divergence: str = "fkl",
    temperature: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A divergence between p_k (the target's cached top k, renormalised, zero elsewhere) and q.

    Exact for p_k and computed from q at the k cached tokens plus q's mass outside them, so no
    (N, V) tensor but q's log-softmax is formed (on a CPU the vocabulary-wide passes of the dense
    formulas cost as much as the draft's layers). With p_k = 0 outside the top k:

    - ``fkl``  = sum_k p_k (log p_k - log q_k)
    - ``tvd``  = 1/2 (sum_k |p_k - q_k| + (1 - Q)),  Q = sum_k q_k
    - ``jsd:B``= B sum_k p_k log(p_k / m_k) + (1 - B) [sum_k q_k log(q_k / m_k) - (1 - Q) log(1 - B)],
      m_k = B p_k + (1 - B) q_k
    - RKL = KL(q || p_k) is infinite wherever q has mass outside the top k: refused.

    Args:
        top_ids: (N, k) token ids of the target's top k.
        top_logp: (N, k) their log-probabilities at temperature 1.
        q_logits: (N, V) draft logits (with gradient).
        divergence: fkl, tvd, jsd or jsd:BETA.
        temperature: shared temperature (the top-k part of p at temperature T is exact).

    Returns:
        (mean divergence over N, mean acceptance sum_k min(p_k, q_k) without gradient).
    """
    name, beta = parse_topk_divergence(divergence)
    valid = top_logp > -math.inf  # (N, k) entries off a restricted head are -inf (`restrict_top`): p = q = 0
    lq = torch.log_softmax(q_logits.float() / temperature, dim=-1).gather(-1, top_ids)  # (N, k)
    lq = lq.masked_fill(~valid, -math.inf)
    lp = torch.log_softmax(top_logp.float() / temperature, dim=-1)  # (N, k)
    p, q = lp.exp(), lq.exp()
    outside = (1 - q.sum(-1)).clamp_min(0)  # (N,) q's mass off the top k

    def where_p(x: torch.Tensor) -> torch.Tensor:
        return torch.where(valid, x, torch.zeros_like(x))

    if name == "fkl":
        per = where_p(p * (lp - lq)).sum(-1)
    elif name == "tvd":
        per = 0.5 * ((p - q).abs().sum(-1) + outside)
    else:
        lm = torch.logaddexp(lp + math.log(beta), lq + math.log(1 - beta))
        per = beta * where_p(p * (lp - lm)).sum(-1) + (1 - beta) * (
            where_p(q * (lq - lm)).sum(-1) - outside * math.log(1 - beta)
        )
    with torch.no_grad():
        acc = torch.minimum(p, q).sum(-1).mean()
    return per.mean(), acc
