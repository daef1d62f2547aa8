"""llama.cpp's own costs on one GGUF (issue #79 item 2, for shapes our runtime cannot load whole here):
load seconds, prefill tokens/s of a prompt of --prompt-tokens ids, the one-row step's median over
--steps one-row steps, and the process's peak resident memory against the file's size. Ids are the
file's own vocabulary's (a seeded draw): a shaped target's tokens mean nothing, its costs do.

    python scripts/peer_costs.py /tmp/qwen7b-shaped.gguf --threads 2 --out docs/bench/shaped-7b-amx/llama_cpp.json
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import time
from pathlib import Path


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import llama_cpp
    import numpy as np

    start = time.perf_counter()
    llm = llama_cpp.Llama(model_path=args.gguf, n_ctx=args.prompt_tokens + args.steps + 8, n_threads=args.threads,
                          n_threads_batch=args.threads, verbose=False)  # fmt: skip
    load_s = time.perf_counter() - start
    rng = np.random.default_rng(0)
    ids = [int(i) for i in rng.integers(100, min(llm.n_vocab(), 150000), args.prompt_tokens)]
    start = time.perf_counter()
    llm.eval(ids)
    prefill_s = time.perf_counter() - start
    steps = []
    for token in ids[: args.steps]:  # any ids: a step's cost does not depend on which token it is
        start = time.perf_counter()
        llm.eval([token])
        steps.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    size = Path(args.gguf).stat().st_size
    report = {
        "gguf": args.gguf, "file_mib": round(size / 2**20, 1), "threads": args.threads, "host": platform.processor(),
        "load_s": round(load_s, 2), "prefill_tokens": args.prompt_tokens,
        "prefill_tokens_per_s": round(args.prompt_tokens / prefill_s, 1),
        "step_ms_median": round(statistics.median(steps) * 1000, 2), "steps": args.steps,
        "peak_rss_mib": round(peak / 2**20, 1), "peak_over_file": round(peak / size, 3),
        "system_info": llama_cpp.llama_print_system_info().decode(),
    }  # fmt: skip
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: v for k, v in report.items() if k != "system_info"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
