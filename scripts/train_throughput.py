"""Scored positions per second of `train-draft` steps: the target recomputed every step (how training
ran before the feature store) against the same steps read back from the store (every epoch after the
first), same batches, same module, same host. Optionally profiles both.

    python scripts/train_throughput.py --data ../shared/data/seqkd --store runs/store-bench --steps 12 \
        --out docs/bench/train-throughput

Writes OUT/throughput.json (and OUT/profile-*.txt with --profile).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import time
from pathlib import Path

import torch

from quickdraft.runtime.forward.native import NativeLlama
from quickdraft.training.feature_store import Batch, FeatureStore
from quickdraft.training.seqkd import read_seqkd, window
from quickdraft.training.train_heads import HeadTrainingConfig, batch_indices, new_module, target_states, train_loss
from quickdraft.training.train_run import scored_positions
from quickdraft.weights.loading import load_model


def recomputed(net, windows, picked, layer) -> Batch:
    """The old way: run the frozen target over every window of the batch, now."""
    states = [target_states(net, windows[i][0], layer) for i in picked]
    width = max(len(windows[i][0]) for i in picked)
    hidden = int(net.embed.shape[1])
    ids = torch.zeros(len(picked), width, dtype=torch.long)
    feats = torch.zeros(len(picked), width, hidden, dtype=torch.bfloat16)
    shallow = None if layer is None else torch.zeros_like(feats)
    for b, (i, s) in enumerate(zip(picked, states, strict=True)):
        n = len(windows[i][0])
        ids[b, :n] = torch.tensor(windows[i][0])
        feats[b, :n] = s["features"]
        if shallow is not None:
            shallow[b, :n] = s[layer]
    return Batch(ids, [len(windows[i][0]) for i in picked], [windows[i][1] for i in picked], feats, shallow)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--store", required=True, help="feature store folder (filled by the warm-up pass)")
    ap.add_argument("--kind", default="head")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--ttt-steps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    target = load_model(None, "bfloat16")
    net = NativeLlama(target.model)
    cfg = HeadTrainingConfig(kinds=(args.kind,), batch_size=args.batch_size, max_len=args.max_len)
    layer = cfg.exit_layer if args.kind == "kangaroo" else None
    windows = [window(r, args.max_len) for r in read_seqkd(Path(args.data), "train")]
    meta = {"target": target.name, "dtype": str(net.dtype), "max_len": args.max_len, "exit_layer": layer}
    store = FeatureStore(Path(args.store) / "train", windows, int(net.embed.shape[1]), layer, meta)  # as train-draft
    embed = net.embed.detach()
    head = net.head[: min(8192, target.output_vocab_size)].detach()  # a restricted head's size
    batches = [batch_indices(len(windows), s, args.batch_size, 0) for s in range(args.steps)]
    for picked in batches:  # warm-up pass: the store holds these windows (not timed)
        store.fill(picked, lambda ids: target_states(net, ids, layer))
    store.flush()

    def run(source) -> dict:
        torch.manual_seed(0)
        module = new_module(args.kind, target.model, cfg)
        opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
        positions, start = 0, time.perf_counter()
        for picked in batches:
            batch = source(picked)
            positions += scored_positions(batch.lengths, batch.prompt_lens)
            with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
                loss, _ = train_loss(module, batch, embed, head, 1.0, args.ttt_steps)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        seconds = time.perf_counter() - start
        return {"positions": positions, "seconds": round(seconds, 2), "positions_per_s": round(positions / seconds, 1)}

    sources = {"recomputed": lambda picked: recomputed(net, windows, picked, layer), "store": store.batch}
    result = {}
    for name, source in sources.items():
        run(source)  # one untimed pass each (allocator, caches)
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
        result[name] = run(source)
        if args.profile:
            prof.disable()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(15)
            (out / f"profile-{name}.txt").write_text(text.getvalue())
        print(name, result[name], flush=True)
    result["speedup"] = round(result["store"]["positions_per_s"] / result["recomputed"]["positions_per_s"], 2)
    result["setup"] = {
        **{k: v for k, v in vars(args).items() if k not in ("data", "store", "out")},
        "cpu": platform.processor() or platform.machine(),
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
    }
    (out / "throughput.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
