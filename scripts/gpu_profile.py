"""Where a decoded token's time goes on a GPU (issue #50): ms per token, launches, syncs, top ops.

For each method (default: plain decoding and the default `sd`), on the embedded default target:
one warm generation (graphs captured), then `--tokens` new tokens timed, then the same under
`torch.profiler` (CPU and CUDA activities). Prints, per method:
- ms per token and per target forward (wall clock, CUDA synchronized);
- per target forward: CUDA kernels launched, graph launches, device-to-host copies and synchronizing
  calls (each one a wait on the GPU), and the GPU's busy time (the sum of kernel times);
- the 25 ops with the most self CPU time and the 15 kernels with the most CUDA time.

    python scripts/gpu_profile.py --device cuda --methods ar,sd --tokens 64
    python scripts/gpu_profile.py --device cpu --tokens 16       # a rehearsal without a GPU
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.profiler import ProfilerActivity, profile

from quickdraft import Engine
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.settings.options import options_from
from quickdraft.weights.loading import load_model

PROMPT = "Write a Python function that returns the sum of a list of numbers, then show an example call."
SYNCS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def method_spec(text: str) -> dict:
    """ "sd:drafter=head" -> {"method": "sd", "drafter": "head"} (the bench's method syntax)."""
    name, _, rest = text.partition(":")
    spec = {"method": name}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        spec[key] = value
    return spec


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def replay_cost(engine, device: str, times: int = 20) -> None:
    """Each captured graph of the lone decoder replayed `times` times back to back, unprofiled: the
    host's launch time a replay (the calls return before the GPU is done) and the time a replay end
    to end (GPU-bound where the GPU takes longer than the launch)."""
    decoder = engine.parts.memo.get(("batch_decoder", 1))
    static = None if decoder is None else decoder.target.static
    if device != "cuda" or static is None:
        return
    graphs = {f"round {key}": graph for key, graph in static.captured.items()}
    graphs.update({f"chain step (1, {span})": graph for span, (graph, _) in static.chains.items()})
    for name, graph in sorted(graphs.items())[:4]:
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(times):
            graph.replay()
        launched = time.perf_counter()
        torch.cuda.synchronize()
        done = time.perf_counter()
        print(
            f"- graph {name}: launch {1000 * (launched - start) / times:.3f} ms of host a replay, "
            f"{1000 * (done - start) / times:.3f} ms a replay end to end"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--methods", default="ar,sd")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    loaded = load_model(None, "bfloat16")
    for text in args.methods.split(";") if ";" in args.methods else args.methods.split(","):
        engine = Engine(loaded, options_from({**method_spec(text), "device": args.device}))
        ids = engine.encode(PROMPT)
        stop = StopConfig(args.tokens, (), ())  # no EOS: exactly `tokens` tokens
        engine.generate_ids(ids, SamplingConfig(), stop)  # warm: graphs captured, costs measured
        sync(args.device)
        start = time.perf_counter()
        out = engine.generate_ids(ids, SamplingConfig(), stop)
        sync(args.device)
        wall = time.perf_counter() - start
        forwards = max(out.stats.num_target_forwards, 1)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=activities) as prof:
            engine.generate_ids(ids, SamplingConfig(), stop)
            sync(args.device)
        events = prof.key_averages()
        count = lambda names, events=events: sum(e.count for e in events if e.key in names)  # noqa: E731
        kernels = [e for e in events if getattr(e, "device_type", None) == torch.autograd.DeviceType.CUDA]
        busy_ms = sum(e.self_device_time_total for e in kernels) / 1000 if kernels else 0.0
        print(f"\n## {text} on {args.device}: {len(out.token_ids)} tokens, {forwards} target forwards")
        print(f"- wall: {wall * 1000 / len(out.token_ids):.3f} ms a token, {wall * 1000 / forwards:.3f} ms a forward")
        print(f"- tokens per forward {out.stats.tokens_per_target_forward:.2f}")
        print(
            f"- per forward: {count(('cudaLaunchKernel', 'cudaLaunchKernelExC')) / forwards:.1f} kernel launches, "
            f"{count(('cudaGraphLaunch',)) / forwards:.2f} graph launches, "
            f"{count(('cudaMemcpyAsync',)) / forwards:.1f} cudaMemcpyAsync, "
            f"{count(SYNCS) / forwards:.2f} synchronizing calls, "
            f"{count(('aten::item', 'aten::_local_scalar_dense')) / forwards:.1f} item reads, "
            f"GPU busy {busy_ms / forwards:.3f} ms"
        )
        replay_cost(engine, args.device)
        print("\n### self CPU time, top 25\n```")
        print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))
        print("```")
        if kernels:
            print("\n### CUDA time, top 15\n```")
            print(events.table(sort_by="self_cuda_time_total", row_limit=15, max_name_column_width=60))
            print("```")
        engine.close()


if __name__ == "__main__":
    main()
