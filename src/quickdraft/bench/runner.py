"""Run methods x prompts x runs on one machine in one process and write results.jsonl / results.json.

Fairness: one loaded target shared by every method, one dtype and one thread count for all, a
warm-up generation per method, and the methods interleaved prompt by prompt so that machine drift
hits all of them alike. Plain decoding ("ar") is always measured in the same run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from tqdm import tqdm

from quickdraft.bench.datasets import load_prompts
from quickdraft.bench.memory import TreePeak, peak_rss_mib
from quickdraft.bench.methods import QuickdraftMethod, build_method
from quickdraft.bench.metrics import summarize
from quickdraft.bench.peers.child import PeerCrashed
from quickdraft.bench.peers.gguf_peer import sized_for
from quickdraft.bench.plan import _is_plain, _methods_with_ar, _sampled, _weights
from quickdraft.errors import QuickdraftError
from quickdraft.host import machine_info
from quickdraft.prompts import PromptCodec
from quickdraft.settings.defaults import AUTO, auto_weights
from quickdraft.weights.loading import LoadedModel, load_model

QUICK_CATEGORIES_LIMIT = 1  # --quick: the first prompt of each of the 13 Spec-Bench categories


@dataclass
class BenchConfig:
    """Everything one benchmark run depends on (recorded in results.json)."""

    methods: str = "ar,sd:drafter=ngram"
    prompts: str = "spec_bench"
    categories: list[str] | None = None
    limit: int | None = None
    max_new_tokens: int = 128
    runs: int = 3
    target: str | None = None
    dtype: str = "bfloat16"
    threads: int | None = None
    runtime: str = "auto"
    device: str = "auto"
    quantize: str = AUTO  # the default weights of our methods (a method's own quantize= key wins; settings/defaults.py)
    batch: int | None = None  # also run each run's prompts as one continuous batch (0: max batch fitted)
    out: str = "bench-out"
    command: str = ""
    extra: dict = field(default_factory=dict)


def run_bench(config: BenchConfig, target: LoadedModel | None = None, progress: bool = True) -> dict:
    """Run the benchmark; returns the summary written to OUT/results.json. The memory of the bench and
    of every process under it is sampled throughout (`bench/memory.py`)."""
    memory = TreePeak(os.getpid()).start()
    try:
        return _run_bench(config, target, progress, memory)
    finally:
        memory.stop()


def _run_bench(config: BenchConfig, target: LoadedModel | None, progress: bool, memory: TreePeak) -> dict:
    if config.runs < 1 or config.max_new_tokens < 1:
        raise QuickdraftError("--runs and --max-new-tokens must be >= 1")
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    records = load_prompts(config.prompts, config.categories, config.limit)
    target = target or load_model(config.target, config.dtype)
    if config.quantize == AUTO:  # the weights our methods run by default, resolved for this target
        choice = auto_weights(target, config.dtype, config.runtime, config.device)
        config = replace(config, quantize=choice.value, extra={**config.extra, "weights_choice": choice.reason})
    specs = _methods_with_ar(config.methods, config.quantize)
    plain = {s.text: _is_plain(s) for s in specs}
    sampled = {s.text: _sampled(s) for s in specs}
    weights_of = {s.text: _weights(s, config.quantize) for s in specs}
    failed = Failures(plain, weights_of)
    methods = {}
    # plain decoding of the bench's own weights first: every other row is compared with its output
    specs = sorted(specs, key=lambda s: not (plain[s.text] and weights_of[s.text] == config.quantize))
    codec = PromptCodec.for_target(target)
    prompt_ids = {r.question_id: codec.encode(r.prompt) for r in records}
    longest = max((len(ids) for ids in prompt_ids.values()), default=0) + config.max_new_tokens
    with sized_for(longest):  # the peers' context fits the longest prompt
        for s in specs:
            if s.text not in failed.reasons:
                with failed.guard(s.text, methods):
                    methods[s.text] = build_method(s, target, config.dtype, config.runtime, config.quantize)

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    for text, m in list(methods.items()):  # warm-up, not recorded
        if text not in methods:  # dropped this loop: its plain reference died
            continue
        with failed.guard(text, methods):
            m.run(prompt_ids[records[0].question_id], min(8, config.max_new_tokens))

    rows: list[dict] = []
    reference: dict[tuple[str, str], list[int]] = {}  # (question, weights) -> plain decoding's tokens
    total = len(records) * config.runs * len(methods)
    with open(out / "results.jsonl", "w") as fh, tqdm(total=total, disable=not progress, desc="bench") as bar:
        for run in range(config.runs):
            for rec in records:
                ids = prompt_ids[rec.question_id]
                for text, method in list(methods.items()):
                    if text not in methods:  # dropped this round (closed): its plain reference died
                        continue
                    res = None
                    with failed.guard(text, methods):
                        res = method.run(ids, config.max_new_tokens)
                    if res is None:
                        continue
                    weights = weights_of[text]
                    if plain[text]:
                        reference.setdefault((rec.question_id, weights), res.token_ids)
                    row = {
                        "question_id": rec.question_id,
                        "category": rec.category,
                        "method": text,
                        "quantize": weights,
                        "run": run,
                        "new_tokens": len(res.token_ids),
                        "prompt_tokens": len(ids),
                        **asdict(res),
                        "plain": plain[text],
                        # lossless means: equal to plain decoding of the same weights (None: a sampled
                        # run, whose losslessness is its distribution's, tested, not one output's)
                        "match_ar": None if sampled[text] else res.token_ids == reference[(rec.question_id, weights)],
                        # and with other weights, how often the output is our plain decoding's
                        "agrees_ar": None
                        if sampled[text]
                        else res.token_ids == reference[(rec.question_id, config.quantize)],
                    }
                    if text == "ar" and run == 0:
                        row["prompt_ids"] = ids
                    rows.append(row)
                    fh.write(json.dumps(row) + "\n")
                    bar.set_postfix_str(f"{text[:24]} {row['new_tokens'] / max(res.wall_s, 1e-9):.1f} tok/s")
                    bar.update()
    rows = [r for r in rows if r["method"] in methods]  # a method that died mid-run is left out whole
    batched = _batched(methods, records, prompt_ids, rows, config) if config.batch is not None else None
    for m in methods.values():  # stop worker processes (parallel PEARL, llama.cpp)
        m.close()
    summary = summarize(rows)
    if batched is not None:
        summary["batched"] = batched
    if failed.reasons:
        summary["failed"] = dict(failed.reasons)
    builds = {t: m.system_info for t, m in methods.items() if getattr(m, "system_info", None)}
    if builds:
        summary["peer_builds"] = builds
    choices = {t: m.engine.choices for t, m in methods.items() if isinstance(m, QuickdraftMethod) and m.engine.choices}
    if choices:  # what each default resolved to, and why (settings/defaults.py)
        summary["choices"] = choices
    graphs = {t: m.engine.graph_report() for t, m in methods.items() if isinstance(m, QuickdraftMethod)}
    if any(graphs.values()):  # captured at warm-up, outside the timing (issue #70)
        summary["graphs"] = {t: g for t, g in graphs.items() if g}
    summary["config"] = asdict(config)
    summary["machine"] = machine_info(config.device)
    summary["peak_rss_mib"] = {**peak_rss_mib(), "together_pss": memory.stop(), "at_peak_pss": memory.at_peak}
    summary["prompt_set"] = {
        "source": config.prompts,
        "num_prompts": len(records),
        "categories": sorted({r.category for r in records}),
    }
    summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (out / "results.json").write_text(json.dumps(summary, indent=1))
    from quickdraft.bench.report import write_report

    write_report(out, summary, rows)
    silent = [
        m
        for m, s in summary["methods"].items()
        if methods[m].speculative
        and m.startswith(("sd", "pearl"))
        and s["num_draft_tokens"] == 0
        and not s.get("speculation_declined")
    ]
    for m, s in summary["methods"].items():
        if s.get("speculation_declined"):
            print(f"quickdraft: {m}: this host's costs declined to draft (plain decoding ran)", file=sys.stderr)
    if silent:
        raise QuickdraftError(f"speculative method(s) drafted nothing: {', '.join(silent)} (see {out}/report.md)")
    return summary


class Failures:
    """Methods whose peer process died (`PeerCrashed`): each is dropped with its one-line reason, and
    so is every method whose lossless reference it was (plain decoding of the same weights); the bench
    goes on with the others and its report lists them.

    Args:
        plain: whether each method is plain decoding of its weights.
        weights: each method's weights (what its lossless match compares with).
    """

    def __init__(self, plain: dict[str, bool], weights: dict[str, str]) -> None:
        self.plain, self.weights = plain, weights
        self.reasons: dict[str, str] = {}

    @contextmanager
    def guard(self, text: str, methods: dict | None = None):
        """Run the body; a PeerCrashed drops `text` (and what compares with it) from `methods`."""
        try:
            yield
        except PeerCrashed as exc:
            self.reasons[text] = str(exc)
            print(f"quickdraft: bench: {exc}; the other methods go on", file=sys.stderr)
            if self.plain[text]:
                for other, w in self.weights.items():
                    if other != text and w == self.weights[text]:
                        self.reasons.setdefault(other, f"{other}: its plain reference {text} died")
            for dead in self.reasons:
                if methods is not None and dead in methods:
                    methods.pop(dead).close()


def _batched(methods: dict, records, prompt_ids: dict, rows: list[dict], config: BenchConfig) -> dict:
    """Each method that can batch runs every prompt of a run in one continuous batch, `config.runs`
    times: aggregate tokens/s beside the same method's one-at-a-time tokens/s of this bench run, and
    the share of outputs equal to its one-at-a-time outputs."""
    prompts = [prompt_ids[r.question_id] for r in records]
    out = {}
    for text, method in methods.items():
        if not isinstance(method, QuickdraftMethod):  # peers (transformers' generate) do not batch
            continue
        alone = {(r["question_id"], r["run"]): r for r in rows if r["method"] == text}
        tokens = walls = same = 0
        for run in range(config.runs):
            got = method.run_batch(prompts, config.max_new_tokens, config.batch or None)
            if got is None:
                break
            outputs, wall = got
            tokens, walls = tokens + sum(map(len, outputs)), walls + wall
            same += sum(o == alone[(r.question_id, run)]["token_ids"] for o, r in zip(outputs, records, strict=True))
        if not walls:
            continue
        seq_tokens = sum(r["new_tokens"] for r in alone.values())
        seq_wall = sum(r["wall_s"] for r in alone.values())
        rate, seq_rate = tokens / walls, seq_tokens / seq_wall
        out[text] = {
            "max_batch": config.batch or "fitted",
            "tokens_per_s": round(rate, 2),
            "one_at_a_time_tokens_per_s": round(seq_rate, 2),
            "throughput_ratio": round(rate / seq_rate, 2),
            "matches_one_at_a_time": round(same / (len(prompts) * config.runs), 3),
        }
    return out
