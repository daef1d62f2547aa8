"""The DistillSpec training loop: frozen target p, trainable draft q, resumable checkpoints.

Each step: pick a data generator from the mixture, build a batch (sampling it from the target or
the draft when the generator says so, without gradient), run the frozen target and the draft over
it, and minimise the chosen divergence between the processed p and q at the scored positions.

Checkpoints are ordinary Hugging Face model folders (`<output>/checkpoint`, written atomically),
next to `trainer_state.pt` (optimizer, scheduler, step) and `history.jsonl` (one line per step).
Running the same command again resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from quickdraft.errors import QuickdraftError
from quickdraft.host import native_bf16
from quickdraft.training.cache import CachedData, topk_divergence
from quickdraft.training.data import Batch, Example, Mixture, parse_mix
from quickdraft.training.losses import LossProcessing, distill_loss, make_divergence, restrict_top
from quickdraft.training.scoring import scored_logits
from quickdraft.training.student import Student, draft_head_ids, save_delta
from quickdraft.training.train_log import truncate_history
from quickdraft.weights.loading import LoadedModel

# fields that must not change when a run is resumed
_RESUME_KEYS = ("init", "divergence", "mix", "cache", "batch_size", "lr", "seed", "temperature", "top_k", "top_p")


@dataclass
class DistillConfig:
    """Options of one distillation run.

    Attributes:
        output: run folder (checkpoint, state, history, delta).
        init: student init, truncated:N or small:... (see distill.student).
        divergence: fkl = KL(p||q), rkl = KL(q||p), jsd[:beta], tvd.
        mix: data generators and weights, e.g. "fixed=0.5,draft=0.5" (draft = on-policy, lambda 0.5).
        steps: total optimizer steps (a resumed run continues up to this number).
        batch_size: sequences per step.
        lr, warmup, min_lr_ratio: AdamW learning rate, linear warm-up steps, cosine floor.
        max_response_tokens: response tokens per sequence (sampled or cut).
        temperature, top_k, top_p: processing shared by p and q in the loss (match inference).
        gen_temperature: sampling temperature of the target/draft data generators.
        checkpoint_every: steps between checkpoints.
        seed: data order and sampling seed.
        draft_vocab: if > 0, the deltas restrict the draft's head to K ids at inference (`draft_head_ids`).
        restrict_head: on cached data, train the draft_vocab head's softmax (as it drafts) toward p over its ids.
        cache: comma-separated cache folders (`quickdraft distill-data`); when set, batches come from
            them (target top-k log-probs stored, no target forward per step) instead of `mix`, and
            the divergence is taken against the cached top k (p_k; fkl, jsd or tvd).
    """

    output: str
    init: str = "truncated:2"
    divergence: str = "fkl"
    mix: str = "fixed=0.5,draft=0.5"
    steps: int = 1000
    batch_size: int = 8
    lr: float = 5e-4
    warmup: int = 20
    min_lr_ratio: float = 0.1
    max_response_tokens: int = 96
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    gen_temperature: float = 1.0
    checkpoint_every: int = 50
    seed: int = 0
    cache: str = ""
    draft_vocab: int = 0
    restrict_head: bool = False
    extra: dict = field(default_factory=dict)


class Distiller:
    """Owns the optimizer and the run folder; `train()` runs (or resumes) to `config.steps`."""

    def __init__(
        self,
        target: LoadedModel,
        student: Student,
        examples: Sequence[Example],
        config: DistillConfig,
        device: str = "cpu",
    ):
        self.device = device  # cuda: both models there, forwards under bf16 autocast
        target.model.to(device)
        student.model.to(device)
        self.cached: CachedData | None = None
        if config.cache:
            if config.top_k or config.top_p < 1:
                raise QuickdraftError("cached data stores the target's top k: --top-k/--top-p do not apply")
            topk_divergence(
                torch.zeros(1, 1, dtype=torch.long), torch.zeros(1, 1), torch.zeros(1, 1), config.divergence
            )
            self.cached = CachedData([Path(f) for f in config.cache.split(",") if f])
        elif not examples:
            raise QuickdraftError("distillation needs at least one training example")
        if config.batch_size < 1 or config.steps < 1:
            raise QuickdraftError("batch_size and steps must be >= 1")
        self.target = target
        self.student = student
        self.examples = list(examples)
        self.config = config
        self.divergence = make_divergence(config.divergence)
        self.proc = LossProcessing(config.temperature, config.top_k, config.top_p)
        self.mixture = Mixture(parse_mix(config.mix), config.max_response_tokens, config.gen_temperature)
        tok = target.tokenizer
        pad = getattr(tok, "pad_token_id", None) if tok is not None else None
        self.eos_ids = set(target.eos_token_ids)
        self.pad_id = pad if pad is not None else (min(self.eos_ids) if self.eos_ids else 0)
        for p in target.model.parameters():
            p.requires_grad_(False)
        target.model.eval()
        params = [p for p in student.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, self._lr_factor)
        self.step = 0
        self.out = Path(config.output)
        self.head_ids = self._head_ids() if config.draft_vocab > 0 else None
        if config.restrict_head and (self.head_ids is None or self.cached is None):
            raise QuickdraftError("--restrict-head trains a --draft-vocab K head on cached data (--cache)")

    def _head_ids(self) -> torch.Tensor:
        """The draft's restricted head (`student.draft_head_ids`): (K,)."""
        if self.cached is not None:
            responses = [s[p:] for s, p in zip(self.cached.sequences, self.cached.prompt_lens, strict=True)]
        else:
            responses = [ex.response for ex in self.examples]
        return draft_head_ids(responses, self.eos_ids, self.config.draft_vocab, self.target.name)

    def _lr_factor(self, step: int) -> float:
        c = self.config
        if step < c.warmup:
            return (step + 1) / c.warmup
        frac = (step - c.warmup) / max(1, c.steps - c.warmup)
        return c.min_lr_ratio + (1 - c.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    # ---- checkpoints -------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.out / "checkpoint"

    def save(self) -> None:
        """Write the HF folder and trainer state to a temp folder, then swap it in (never half-written)."""
        tmp = self.out / "checkpoint.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        self.student.model.save_pretrained(tmp)
        if self.student.loaded.tokenizer is not None:
            self.student.loaded.tokenizer.save_pretrained(tmp)
        torch.save(
            {
                "step": self.step,
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(),
                "config": asdict(self.config),
                "trainable": self.student.trainable,
            },
            tmp / "trainer_state.pt",
        )
        old = self.out / "checkpoint.old"
        shutil.rmtree(old, ignore_errors=True)
        if self.checkpoint_dir.exists():
            self.checkpoint_dir.rename(old)
        tmp.rename(self.checkpoint_dir)
        shutil.rmtree(old, ignore_errors=True)

    def maybe_resume(self) -> bool:
        """Load the last checkpoint of this run folder if there is one; refuse a changed config."""
        state_path = self.checkpoint_dir / "trainer_state.pt"
        if not state_path.is_file():
            return False
        state = torch.load(state_path, map_location=self.device, weights_only=False)
        old = state["config"]
        changed = [k for k in _RESUME_KEYS if old.get(k) != getattr(self.config, k)]
        if changed:
            raise QuickdraftError(
                f"{self.out} holds a run with different {', '.join(changed)} "
                f"({', '.join(f'{k}={old.get(k)!r}' for k in changed)}); use another --output or the same options"
            )
        from safetensors.torch import load_file

        weights = {}
        for f in sorted(self.checkpoint_dir.glob("*.safetensors")):
            weights.update(load_file(str(f)))
        own = dict(self.student.model.named_parameters())
        with torch.no_grad():
            for n in self.student.trainable:
                if n not in weights:
                    raise QuickdraftError(f"checkpoint in {self.checkpoint_dir} lacks {n}")
                own[n].copy_(weights[n].to(own[n].dtype))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.step = int(state["step"])
        truncate_history(self.out / "history.jsonl", self.step)
        return True

    # ---- training ----------------------------------------------------------------------------
    def make_batch(self, step: int) -> Batch:
        """The batch of `step`: generator and examples drawn from (seed, step), so resuming is exact.

        With a cache, the batch carries the target's top k as `batch.p_top` = (ids (N, k), logp (N, k)).
        """
        rng = random.Random(self.config.seed * 1_000_003 + step)
        if self.cached is not None:
            batch, ids, logp = self.cached.batch(rng, self.config.batch_size, self.pad_id)
            batch.p_top = (ids, logp)
            return batch.to(self.device)
        source = self.mixture.pick(rng)
        exs = [self.examples[rng.randrange(len(self.examples))] for _ in range(self.config.batch_size)]
        gen = self.mixture.generators[source]
        return gen.make(
            exs,
            self.pad_id,
            target=self.target.model,
            draft=self.student.model,
            eos_ids=self.eos_ids,
            generator_seed=self.config.seed * 7919 + step,
        ).to(self.device)

    def _autocast(self, student: bool = True) -> torch.autocast:
        """bf16 autocast on CUDA, and for the student on a CPU with native bf16 (where it trains faster than
        float32: docs/training.md; the CPU target's p stays float32)."""
        on_cuda = self.device == "cuda"
        on = on_cuda or (student and native_bf16())
        return torch.autocast("cuda" if on_cuda else "cpu", dtype=torch.bfloat16, enabled=on)

    def train_step(self, batch: Batch) -> tuple[float, float]:
        """One optimizer step on a batch; returns (loss, expected acceptance sum min(p, q))."""
        self.student.model.train()
        if batch.p_top is not None:
            top_ids, top_logp = batch.p_top
            head = self.head_ids if self.config.restrict_head else None
            with self._autocast():
                q_logits = scored_logits(self.student.model, batch, head)
            if head is not None:  # the draft's own softmax over the K ids it drafts from
                top_ids, top_logp, keep = restrict_top(top_ids, top_logp, head, self.target.output_vocab_size)
                q_logits = q_logits[keep]
            c = self.config
            loss, acc = topk_divergence(top_ids, top_logp, q_logits.float(), c.divergence, c.temperature)
        else:
            with torch.no_grad(), self._autocast(student=False):
                p_logits = scored_logits(self.target.model, batch)
            with self._autocast():
                q_logits = scored_logits(self.student.model, batch)
            mask = torch.ones(p_logits.shape[0], dtype=torch.bool, device=p_logits.device)
            loss, acc = distill_loss(p_logits.float(), q_logits.float(), mask, self.divergence, self.proc)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for p in self.student.model.parameters() if p.requires_grad], 1.0)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach()), float(acc)

    def train(self, progress: bool = True) -> list[dict]:
        """Run from the current step to config.steps; checkpoint every `checkpoint_every` and at the end."""
        self.out.mkdir(parents=True, exist_ok=True)
        self.maybe_resume()
        history: list[dict] = []
        bar = tqdm(total=self.config.steps, initial=self.step, desc="distill", disable=not progress, dynamic_ncols=True)
        with open(self.out / "history.jsonl", "a") as log:
            while self.step < self.config.steps:
                start = time.perf_counter()
                batch = self.make_batch(self.step)
                loss, acc = self.train_step(batch)
                self.step += 1
                row = {
                    "step": self.step,
                    "source": batch.source,
                    "loss": loss,
                    "expected_acceptance": acc,
                    "tokens": batch.num_scored,
                    "lr": self.scheduler.get_last_lr()[0],
                    "seconds": time.perf_counter() - start,
                }
                history.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
                bar.set_postfix(loss=f"{loss:.3f}", acc=f"{acc:.3f}", src=batch.source)
                bar.update(1)
                if self.step % self.config.checkpoint_every == 0 or self.step == self.config.steps:
                    self.save()
                    if self.student.init.startswith("truncated:"):
                        meta = {"step": self.step, "config": asdict(self.config), "target": self.target.name}
                        folder = self.out / "snapshots" / f"step-{self.step:05d}"
                        save_delta(self.student, folder, meta, head_ids=self.head_ids)
        bar.close()
        return history
