"""Each drafter's own step against the target's, beside its weight bytes (issue "the step at the floor",
item 4: a draft step should cost at most 1.2 x (its weight bytes / the target's) of a target step).

    python scripts/draft_costs.py [--drafters distilled,truncated:6,kangaroo,head,specdec,quant:w4a8,...]

Target: the embedded default in bf16 on the native runtime, this host's threads. Draft steps come from
each drafter's own `step_seconds()` (what PEARL's window and the tree budget read), medians of 5 calls
each; the target step from `models.timing.step_seconds` (median of 15). Weight bytes count the
parameters the draft step reads (a truncated or self-drafting model: its layers and the LM head it uses).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from quickdraft.costs.timing import step_seconds
from quickdraft.drafters import make_drafter
from quickdraft.host import cpu_model
from quickdraft.runtime.target import load_target
from quickdraft.weights.loading import load_model

DEFAULT = "distilled,truncated:6,kangaroo,head,specdec,quant:int4,quant:gguf,quant:w4a8"


def weight_bytes(module) -> int:
    return sum(p.numel() * p.element_size() for p in module.parameters()) if module is not None else 0


def read_bytes(model) -> int:
    """Bytes a step of an HF causal LM reads: its parameters, less an untied embedding table (a lookup;
    a tied one is the LM head, read every step, and counted once)."""
    embed = model.get_input_embeddings().weight
    tied = embed.data_ptr() == model.get_output_embeddings().weight.data_ptr()
    return weight_bytes(model) - (0 if tied else embed.numel() * embed.element_size())


def draft_bytes(drafter, loaded) -> int | None:
    """Bytes one draft step reads: a draft model's (`read_bytes`; a restricted head counted whole, an
    upper bound); a module drafter's parameters plus the LM head rows it multiplies (HeadLM) and, for
    Kangaroo, the target's first l layers it runs; a quantized self-draft: its kernel-form linears and
    norms."""
    if drafter.name.startswith("quant"):  # the target's own weights in kernel form, plus its norms
        from quickdraft.runtime.quant.modes import parse_quantize
        from quickdraft.runtime.quant.quantized import quantize_model

        mode = drafter.name.split(":", 1)[1] if ":" in drafter.name else "w4a8"
        quantized = quantize_model(loaded, parse_quantize(mode.split("@")[0]))
        norms = sum(weight_bytes(layer.input_layernorm) + weight_bytes(layer.post_attention_layernorm)
                    for layer in loaded.model.model.layers)  # fmt: skip
        return quantized.nbytes + norms
    model = getattr(getattr(drafter, "model", None), "model", None)  # ModelDrafter -> cache owner -> HF model
    if model is not None:
        return read_bytes(model)
    module = getattr(drafter, "head", None) or getattr(drafter, "adapter", None)
    lm = getattr(drafter, "lm", None)
    if module is None or lm is None:
        return None
    total = weight_bytes(module) + lm.weight.numel() * lm.weight.element_size()
    for layer in loaded.model.model.layers[: drafter.runs_target_layers]:
        total += weight_bytes(layer)
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--drafters", default=DEFAULT)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(None, "bfloat16")
    target = load_target(loaded).target
    target_bytes = read_bytes(loaded.model)
    target_step = statistics.median(step_seconds(target, context=200) for _ in range(3))
    rows = []
    for spec in args.drafters.split(","):
        drafter = make_drafter(spec, loaded, "bfloat16", "auto")
        if drafter.runs_target_layers:
            from quickdraft.decoding.common import StateHandoff

            StateHandoff.of(drafter, target)  # binds the shallow pass over the target's cache
        steps = [drafter.step_seconds() for _ in range(5)]
        step = statistics.median(s for s in steps if s is not None) if any(s is not None for s in steps) else None
        nbytes = draft_bytes(drafter, loaded)
        rows.append(
            {
                "drafter": spec,
                "draft_step_ms": None if step is None else round(1e3 * step, 3),
                "relative_step": None if step is None else round(step / target_step, 3),
                "weight_bytes_ratio": None if nbytes is None else round(nbytes / target_bytes, 3),
            }
        )
        print(rows[-1], flush=True)
    print(f"{cpu_model()}, {args.threads} threads; target step {1e3 * target_step:.2f} ms")
    print("| drafter | draft step (ms) | / target step | weight bytes / target's | bound 1.2x bytes |")
    print("|---|---|---|---|---|")
    for r in rows:
        ratio, rel = r["weight_bytes_ratio"], r["relative_step"]
        bound = "-" if ratio is None or rel is None else ("met" if rel <= 1.2 * ratio else "missed")
        print(f"| `{r['drafter']}` | {r['draft_step_ms']} | {rel} | {'-' if ratio is None else ratio} | {bound} |")
    print(json.dumps({"target_step_ms": round(1e3 * target_step, 3), "drafters": rows}))


if __name__ == "__main__":
    main()
