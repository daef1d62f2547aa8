"""A target's memory at each step of a load (issue #79 item 2): converted on first use (the bf16 folder,
written in shards), loaded, built as the defaults build it (its GGUF's own blocks), then a few greedy
tokens; the process's resident and peak memory (VmRSS, VmHWM; anonymous and file pages) after each.
The peak is reset after the conversion, which runs once per file, so the load's own peak is its own.

    python scripts/load_memory.py /tmp/shaped/qwen2.5-7b-shaped-q4_k_m.gguf
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

START = time.perf_counter()


def status(step: str) -> None:
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(("VmRSS", "VmHWM", "RssFile", "RssAnon")):
            fields[line.split(":")[0]] = f"{int(line.split()[1]) / 2**20:.2f} GiB"
    print(f"{time.perf_counter() - START:7.1f}s {step} {fields}", flush=True)


def main() -> int:
    target = sys.argv[1] if len(sys.argv) > 1 else "qwen2.5-coder-1.5b"
    from quickdraft import Engine
    from quickdraft.config import SamplingConfig, StopConfig
    from quickdraft.settings.options import options_from
    from quickdraft.weights.default import converted_target
    from quickdraft.weights.loading import load_model

    status("start")
    print(converted_target(target))
    status("converted")
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident size
    loaded = load_model(target)
    status("loaded")
    engine = Engine(loaded, options_from({"method": "ar"}))
    status("engine")
    print(engine.info)
    engine.generate_ids(engine.encode("def fib(n):"), SamplingConfig(), StopConfig(8))
    status("generated")
    return 0


if __name__ == "__main__":
    sys.exit(main())
