"""Teacher-forced top-1 agreement of a GGUF target as we run it with llama.cpp on the same file (issue #49).

For N HumanEval prompts (chat template), llama.cpp's own greedy continuation of T tokens is taken as
the text; each prefix of it is then scored by llama.cpp (one eval with logits_all), by our native
runtime on the GGUF's own blocks (`--quantize w4a8`) and on the bf16 weights converted from them, and
the top-1 ids are compared position by position:

    python scripts/pair_agreement.py --target qwen2.5-coder-1.5b --prompts 12 --tokens 96 \
        --out docs/bench/pair-agreement

Writes agreement.json (with the host) under --out.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch

from quickdraft.bench.datasets import load_prompts
from quickdraft.bench.peers.child import ChildPeer
from quickdraft.bench.peers.llama_cpp_peer import WORKER
from quickdraft.host import machine_info
from quickdraft.prompts import PromptCodec
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.quant.modes import parse_quantize
from quickdraft.runtime.quant.quantized import quantize_model
from quickdraft.weights.loading import load_model


def ours(owner: NativeCachedModel, seq: list[int], start: int) -> list[int]:
    """Our top-1 after each prefix seq[:i + 1], for i from start - 1 on."""
    owner.reset()
    return owner.extend(seq[:-1])[start - 1 :].argmax(-1).tolist()


def rate(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--forms", default="w4a8,none", help="our weight forms (none = bf16)")
    ap.add_argument("--out", default="docs/bench/pair-agreement")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.target, "bfloat16")
    codec = PromptCodec.for_target(target)
    prompts = [codec.encode(r.prompt) for r in load_prompts("humaneval", None, None)[: args.prompts]]
    peer = ChildPeer("llama-cpp", WORKER)
    try:
        n_ctx = max(len(p) for p in prompts) + args.tokens + 8
        peer.call("load", model=str(target.gguf), n_ctx=n_ctx, threads=args.threads, lookup=0, logits_all=True)
        seqs, llama = [], []
        for ids in prompts:
            out = peer.call("run", prompt=ids, max_new_tokens=args.tokens, eos=list(target.eos_token_ids))["tokens"]
            seq = ids + out
            seqs.append((seq, len(ids)))
            llama.append(peer.call("argmax", tokens=seq[:-1])["argmax"][len(ids) - 1 :])
            print(f"llama.cpp: prompt {len(seqs)}/{len(prompts)}, {len(out)} tokens", flush=True)
    finally:
        peer.close()
    tops = {"llama.cpp": llama}
    for form in args.forms.split(","):
        q = quantize_model(target, parse_quantize(form)) if form != "none" else None
        owner = NativeCachedModel(target.model, linears=q.linears if q else None)
        tops[form] = [ours(owner, seq, start) for seq, start in seqs]
        print(form, q.describe() if q else "bf16 weights", flush=True)
        del owner, q
    names = list(tops)
    result = {
        "machine": machine_info(),
        "target": target.name,
        "gguf": os.path.basename(target.gguf),
        "prompts": len(seqs),
        "positions": sum(len(r) for r in llama),
        "agreement": {f"{a} vs {b}": rate(tops[a], tops[b]) for i, a in enumerate(names) for b in names[i + 1 :]},
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "agreement.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["agreement"], indent=1))


if __name__ == "__main__":
    main()
