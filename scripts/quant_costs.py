"""Step costs and greedy agreement of each weight form of the target (issue #25's report).

For bf16, int8, w8a8, w4a8, int4 and gguf weights of the target (native runtime, this host's threads):
- the median seconds of a forward over 1, 5, 9 and 17 new rows after 200 cached tokens
  (interleaved across forms, so drift hits each alike);
- teacher-forced greedy agreement with the bf16 target: the bf16 target's own greedy continuations
  of N Spec-Bench prompts, scored position by position (the draft-acceptance bound of a quantized
  self-draft at the first position).

    python scripts/quant_costs.py --out docs/bench/quant-costs [--prompts 6 --tokens 96]
    python scripts/quant_costs.py --forms none,w8a8,int8,gguf --heldout ../shared/data/seqkd --prompts 24
    python scripts/quant_costs.py --target gemma3-270m --forms none,w4a8 --prompts 12 --tokens 64

--heldout DIR scores agreement on the first N held-out rows of the SeqKD corpus (their chat-templated
prompts, the bf16 target's own greedy continuations) instead of Spec-Bench prompts.

Writes costs.json, costs.md and step_costs.png under --out.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from quickdraft.bench.datasets import load_prompts
from quickdraft.host import machine_info
from quickdraft.prompts import PromptCodec
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.quant.modes import parse_quantize
from quickdraft.runtime.quant.quantized import quantize_model
from quickdraft.weights.loading import load_model

FORMS = ("none", "int8", "w8a8", "w4a8", "int4", "gguf")
ROWS = (1, 5, 9, 17)


def greedy(owner: NativeCachedModel, ids: list[int], n: int) -> list[int]:
    owner.reset()
    logits, out = owner.extend(ids, last_only=True), []
    for _ in range(n):
        out.append(int(logits[-1].argmax()))
        logits = owner.extend(out[-1:])
    return out


def agreement(owner: NativeCachedModel, seqs: list[tuple[list[int], list[int]]]) -> float:
    hits = total = 0
    for ids, out in seqs:
        owner.reset()
        logits = owner.extend(ids + out[:-1])[len(ids) - 1 :]
        hits += int((logits.argmax(-1) == torch.tensor(out)).sum())
        total += len(out)
    return hits / total


def heldout_prompts(folder: Path, n: int) -> list[list[int]]:
    """The chat-templated prompt ids of the first n held-out rows of a SeqKD corpus (greedy files first)."""
    import gzip

    out = []
    for path in sorted(folder.glob("seqkd-*.jsonl.gz")):
        with gzip.open(path, "rt") as fh:
            for line in fh:
                row = json.loads(line)
                if row.get("split") == "heldout":
                    out.append(list(row["prompt_ids"]))
                    if len(out) == n:
                        return out
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="docs/bench/quant-costs")
    ap.add_argument("--prompts", type=int, default=6, help="Spec-Bench prompts for agreement (every 13th)")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--forms", default=",".join(FORMS), help="comma-separated weight forms (none = bf16)")
    ap.add_argument("--target", default="default", help="a named target (e.g. gemma3-270m), folder or .gguf")
    ap.add_argument("--heldout", default=None, help="a SeqKD corpus folder: score its held-out prompts")
    args = ap.parse_args()
    forms = tuple(args.forms.split(","))
    torch.set_num_threads(args.threads)
    target = load_model(args.target, "bfloat16")
    codec = PromptCodec.for_target(target)
    owners = {}
    for form in forms:
        q = quantize_model(target, parse_quantize(form)) if form != "none" else None
        owners[form] = NativeCachedModel(target.model, linears=q.linears if q else None)
        print(form, q.describe() if q else "bf16 weights", flush=True)
    if args.heldout:
        prompts = heldout_prompts(Path(args.heldout), args.prompts)
    else:
        records = load_prompts("spec_bench", None, None)[:: max(1, 80 // args.prompts)][: args.prompts]
        prompts = [codec.encode(rec.prompt) for rec in records]
    seqs = [(ids, greedy(owners["none"], ids, args.tokens)) for ids in prompts]
    context = list(range(100, 300))
    times: dict[str, dict[int, list[float]]] = {f: {r: [] for r in ROWS} for f in forms}
    for owner in owners.values():
        owner.reset()
        owner.extend(context)
    for rep in range(args.repeats + 2):
        for form, owner in owners.items():
            for rows in ROWS:
                start = time.perf_counter()
                owner.extend([42] * rows)
                if rep >= 2:  # two warm-up passes
                    times[form][rows].append(time.perf_counter() - start)
                owner.rollback(len(context))
    result = {
        "machine": machine_info(),
        "prompts": len(seqs),
        "tokens_each": args.tokens,
        "forms": {
            form: {
                "step_ms": {r: 1e3 * statistics.median(times[form][r]) for r in ROWS},
                "agreement": agreement(owners[form], seqs),
            }
            for form in forms
        },
        "prompt_source": f"{args.heldout} held-out rows" if args.heldout else "Spec-Bench",
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "costs.json").write_text(json.dumps(result, indent=1) + "\n")
    base = result["forms"]["none"]["step_ms"][1]
    lines = [
        f"Machine: {result['machine']['cpu']} ({result['machine']['cpu_capability']}), {args.threads} threads, "
        f"torch {result['machine']['torch']}; agreement over {len(seqs)} prompts ({result['prompt_source']}) x "
        f"{args.tokens} tokens.",
        "",
        "| weights | "
        + " | ".join(f"{r} row{'s' if r > 1 else ''} (ms)" for r in ROWS)
        + " | 1-row speed vs bf16 | greedy agreement with bf16 |",
        "|---|" + "---|" * (len(ROWS) + 2),
    ]
    for form, v in result["forms"].items():
        cells = " | ".join(f"{v['step_ms'][r]:.1f}" for r in ROWS)
        lines.append(
            f"| {'bf16' if form == 'none' else form} | {cells} | {base / v['step_ms'][1]:.2f}x | {v['agreement']:.3f} |"
        )
    (out / "costs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for form, v in result["forms"].items():
        ax.plot(ROWS, [v["step_ms"][r] for r in ROWS], marker="o", label="bf16" if form == "none" else form)
    ax.set_xlabel("rows in the forward (verify width)")
    ax.set_ylabel("ms per forward")
    ax.set_title("Target forward cost by weight form")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "step_costs.png", dpi=120)


if __name__ == "__main__":
    main()
