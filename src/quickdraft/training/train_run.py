"""One `train-draft` run: the target's states from the feature store, the training loop, evaluations.

A run outlasts a session: it checkpoints every `checkpoint_every` steps (modules, optimizers, the
step, the RNG streams, positions seen) and the same command resumes at that step, with the same data
order (`batch_indices`); the store's windows, once computed, are read back. Held-out evaluations go
to `eval.jsonl` and `eval.png` (`train_log.py`); a progress bar shows the ETA, the agreement, the
store's coverage and scored positions per second.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.training.decode_eval import decode_eval
from quickdraft.training.feature_store import FeatureStore
from quickdraft.training.seqkd import Row, response_mask, window
from quickdraft.training.train_heads import (
    HeadTrainingConfig,
    batch_indices,
    evaluate,
    lr_at,
    new_module,
    target_states,
    target_states_many,
    train_loss,
)
from quickdraft.training.train_log import append_eval, plot_evals, read_evals


@dataclass
class Throughput:
    """Scored positions and seconds of training steps, split by whether the step had to run the
    target (windows not yet in the store: the first pass) or read them all back; `fill_s` is the
    target's share (running it and writing the store), `train_s` the modules' (what equal-compute
    comparisons count)."""

    first_positions: int = 0
    first_s: float = 0.0
    cached_positions: int = 0
    cached_s: float = 0.0
    fill_s: float = 0.0
    train_s: float = 0.0

    def add(self, positions: int, seconds: float, fill_s: float) -> None:
        self.fill_s, self.train_s = self.fill_s + fill_s, self.train_s + seconds - fill_s
        if fill_s > 0:
            self.first_positions, self.first_s = self.first_positions + positions, self.first_s + seconds
        else:
            self.cached_positions, self.cached_s = self.cached_positions + positions, self.cached_s + seconds

    def report(self) -> dict:
        rate = {
            "first_pass_positions_per_s": self.first_positions / self.first_s if self.first_s else None,
            "cached_positions_per_s": self.cached_positions / self.cached_s if self.cached_s else None,
        }
        return {**{k: round(v, 1) for k, v in rate.items() if v is not None}, **self.__dict__}


def scored_positions(lengths: list[int], prompt_lens: list[int]) -> int:
    """Positions whose next token is a response token (what the losses score)."""
    return int(response_mask(lengths, prompt_lens, max(lengths)).sum())


class TrainRun:
    """Set up by `cmd_train_draft`: the frozen target (`net`, its `embed` and LM `full_head`, the
    restricted ids `ids`), the corpus stores, the modules and their optimizers."""

    def __init__(self, cfg: HeadTrainingConfig, out: Path, store: Path, net, target, train: list[Row], held: list[Row],
                 ids: torch.Tensor, device: str, decode_prompts: int, weights: str = "none") -> None:  # fmt: skip
        self.cfg, self.out, self.net, self.target, self.device = cfg, out, net, target, device
        self.weights = weights  # the target's --quantize: decode evaluation runs the same weights
        self.layer = cfg.exit_layer if "kangaroo" in cfg.kinds else None
        meta = {"target": target.name, "dtype": str(net.dtype), "max_len": cfg.max_len, "exit_layer": self.layer}
        if weights != "none":  # states of quantized weights (a store of the bf16 ones keeps its old meta)
            meta["weights"] = weights
        hidden = int(net.embed.shape[1])
        self.train = FeatureStore(store / "train", [window(r, cfg.max_len) for r in train], hidden, self.layer, meta)
        held_windows = [window(r, cfg.max_len) for r in held]
        self.held = FeatureStore(store / "heldout", held_windows, hidden, self.layer, meta)
        # a GPU computes the target's states for 32 windows at once (a CPU: one, the inference forward)
        self.many = None if device == "cpu" else (lambda ws: target_states_many(target.model, ws, self.layer))
        self.held.fill(range(len(held)), self.compute, self.many)
        self.held.flush()
        self.evals = {
            mode: [self.held.batch(chunk) for chunk in _chunks([i for i, r in enumerate(held) if r.mode == mode], 8)]
            for mode in ("greedy", "sample")
        }
        self.prompts = [list(r.prompt) for r in held if r.mode == "greedy"][:decode_prompts]
        self.ids, self.embed = ids, net.embed.detach()
        self.full_head = net.head[: target.output_vocab_size].detach()
        self.sub_head = self.full_head[ids]
        torch.manual_seed(cfg.seed)  # the modules' fresh parameters (SpecDec's queries) and the RNG stream
        self.modules = {k: new_module(k, target.model, cfg).to(device) for k in cfg.kinds}
        self.optims = {
            k: torch.optim.AdamW(m.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
            for k, m in self.modules.items()
        }
        self.step, self.positions, self.history = 0, 0, []
        self.speed = Throughput()
        self.started = time.perf_counter()

    def compute(self, ids: list[int]) -> dict:
        return target_states(self.net, ids, self.layer)

    def resume(self, path: Path) -> bool:
        """Load a checkpoint if there is one (a kind added on resume starts fresh from this step)."""
        if not path.is_file():
            return False
        state = torch.load(path, map_location=self.device, weights_only=False)
        if not set(state["modules"]) <= set(self.cfg.kinds):
            raise QuickdraftError(
                f"{path} trains {sorted(state['modules'])}, not {list(self.cfg.kinds)}: use another --output"
            )
        for k in state["modules"]:
            self.modules[k].load_state_dict(state["modules"][k])
            self.optims[k].load_state_dict(state["optims"][k])
        self.step, self.history = int(state["step"]), state["history"]
        self.positions = int(state.get("positions", 0))
        restore_rng(state)
        return True

    def checkpoint(self, path: Path) -> None:
        self.train.flush()  # the store's flags before the step that relies on them
        save_checkpoint(path, self.step, self.modules, self.optims, self.history, {"positions": self.positions})

    def train_step(self) -> dict:
        """One step of every module on the next batch; returns its history row."""
        cfg = self.cfg
        start = time.perf_counter()
        picked = batch_indices(len(self.train), self.step, cfg.batch_size, cfg.seed)
        computed = self.train.fill(picked, self.compute, self.many)
        fill_s = time.perf_counter() - start if computed else 0.0
        batch = self.train.batch(picked)
        positions = scored_positions(batch.lengths, batch.prompt_lens)
        row: dict = {"step": self.step + 1}
        for k, module in self.modules.items():
            for group in self.optims[k].param_groups:
                group["lr"] = lr_at(self.step, cfg, self.spent if cfg.minutes > 0 else None)
            steps = cfg.ttt_steps if module.unrolls else 1
            with torch.autocast(device_type=self.device, dtype=torch.bfloat16):
                loss, stats = train_loss(module, batch, self.embed, self.sub_head, cfg.feature_weight, steps)
            self.optims[k].zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(module.parameters(), 1.0)
            self.optims[k].step()
            row.update({f"{k}_{name}": round(v, 4) for name, v in stats.items()})
        self.step += 1
        self.positions += positions
        self.speed.add(positions, time.perf_counter() - start, fill_s)
        row["positions"] = self.positions
        row["train_s"] = round(self.speed.train_s, 2)  # cumulative, this session
        self.history.append(row)
        return row

    @property
    def spent(self) -> float:
        """The fraction of this command's time budget (`cfg.minutes`) spent."""
        return min(1.0, (time.perf_counter() - self.started) / (60 * self.cfg.minutes)) if self.cfg.minutes > 0 else 0.0

    def evaluate(self, decode: bool = True) -> dict:
        """Every module on the held-out greedy and sampled rows (teacher-forced, each unrolled step
        for the head), and greedy decoding of held-out prompts; one eval.jsonl line per module."""
        results = {}
        for k, module in self.modules.items():
            steps = max(self.cfg.ttt_steps, 3) if module.unrolls else 1
            row = {"kind": k, "step": self.step, "positions_seen": self.positions}
            for mode, batches in self.evals.items():
                if batches:
                    row[mode] = evaluate(module, batches, self.embed, self.full_head, self.ids, steps)
            if decode and self.prompts:
                row["decode"] = decode_eval(
                    module, k, self.target, self.ids_or_none, self.prompts, quantize=self.weights
                )
            append_eval(self.out / "eval.jsonl", row)
            results[k] = row
        plot_evals(read_evals(self.out / "eval.jsonl"), self.out / "eval.png", f"train-draft {self.out.name}")
        return results

    @property
    def ids_or_none(self) -> torch.Tensor | None:
        return None if self.ids.numel() == self.target.output_vocab_size else self.ids.cpu()

    def run(self, eval_every: int, ckpt: Path, progress: bool) -> None:
        """Train to `cfg.steps` (or until `cfg.minutes` are spent), checkpointing and evaluating on the way."""
        from tqdm import tqdm

        bar = tqdm(total=self.cfg.steps, initial=self.step, disable=not progress, desc="train-draft", unit="step")
        self.started = time.perf_counter()
        while self.step < self.cfg.steps and self.spent < 1.0:
            row = self.train_step()
            bar.update(1)
            rate = self.speed.report()
            bar.set_postfix(
                {
                    **{n: v for n, v in row.items() if n.endswith("agree")},
                    "store": f"{self.train.coverage:.0%}",
                    "pos/s": round(rate.get("cached_positions_per_s") or rate.get("first_pass_positions_per_s") or 0),
                }
            )
            if self.step % self.cfg.checkpoint_every == 0 or self.step == self.cfg.steps or self.spent >= 1.0:
                self.checkpoint(ckpt)
            if eval_every and self.step % eval_every == 0 and self.step < self.cfg.steps:
                bar.clear()
                for k, r in self.evaluate().items():
                    print(f"step {self.step}: {k} {summary(r)}", file=sys.stderr)
        bar.close()


def _chunks(items: list[int], size: int) -> list[list[int]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def summary(row: dict) -> str:
    parts = [f"{mode} agreement {row[mode]['greedy_agreement']:.3f}" for mode in ("greedy", "sample") if mode in row]
    if "decode" in row:
        parts.append(f"tokens per forward {row['decode']['tokens_per_target_forward']:.2f}")
    return ", ".join(parts)


def save_checkpoint(
    path: Path, step: int, modules: dict, optims: dict, history: list, extra: dict | None = None
) -> None:
    """Everything a run needs to go on at `step` exactly: the modules, their optimizers, the history,
    the RNG streams (the block drafter's cuts) and `extra` (e.g. positions seen); written atomically."""
    state = {
        "step": step,
        "modules": {k: m.state_dict() for k, m in modules.items()},
        "optims": {k: o.state_dict() for k, o in optims.items()},
        "history": history,
        "rng": torch.get_rng_state(),
        "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        **(extra or {}),
    }
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def restore_rng(state: dict) -> None:
    """Put back the RNG streams a checkpoint saved (older checkpoints have none)."""
    if state.get("rng") is not None:
        torch.set_rng_state(state["rng"])
    if state.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
