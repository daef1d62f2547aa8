"""The server as an editor leans on it (issue #71's goals), measured against a real `quickdraft serve`.

    cd scripts && python serve_check.py --out ../docs/bench/serve-pair -- --target qwen2.5-coder-1.5b --threads 2 \
        --max-prompt-tokens 32768

Starts the server (the flags after `--`) on a free loopback port and measures, in order:
1. ready: seconds until /health says 200 (load and warm-up);
2. first and warm: the wall time of the same short completion sent first, then twice more;
3. long prompt: a 40,000-character prompt sent and abandoned after 5 s, with /health polled every 0.2 s
   meanwhile (its slowest answer); then the short completion again (its time against the warm one).
Writes `serve.json` to --out and prints one line a measure.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import httpx
from load_test import start_server, wait_ready  # this folder: run as a script

SHORT = {"prompt": "def is_prime(n):\n", "max_tokens": 32, "temperature": 0}


def timed(url: str, body: dict, timeout: float = 600) -> float:
    start = time.perf_counter()
    r = httpx.post(url + "/v1/completions", json=body, timeout=timeout)
    r.raise_for_status()
    return time.perf_counter() - start


def main() -> int:
    argv = sys.argv[1:]
    serve_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/serve"))
    args = ap.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    proc, url = start_server(serve_args)
    out: dict = {"command": "serve " + " ".join(serve_args)}
    try:
        start = time.perf_counter()
        wait_ready(url, proc, timeout_s=900)
        out["ready_s"] = time.perf_counter() - start
        out["first_s"] = timed(url, SHORT)
        out["warm_s"] = min(timed(url, SHORT) for _ in range(2))
        print(f"ready {out['ready_s']:.1f} s; first {out['first_s']:.2f} s, warm {out['warm_s']:.2f} s")
        long_body = {"prompt": "x = 1  # a line of a long file\n" * 1300, "max_tokens": 16}  # 40,300 characters
        done = threading.Event()

        def abandon() -> None:
            try:
                httpx.post(url + "/v1/completions", json=long_body, timeout=5.0)
            except httpx.HTTPError:
                pass
            done.set()

        threading.Thread(target=abandon, daemon=True).start()
        slowest, polls, begin = 0.0, 0, time.perf_counter()
        while not done.is_set() or time.perf_counter() - begin < 7:
            t = time.perf_counter()
            httpx.get(url + "/health", timeout=30).raise_for_status()
            slowest, polls = max(slowest, time.perf_counter() - t), polls + 1
            time.sleep(0.2)
        out["long_prompt_chars"] = len(long_body["prompt"])
        out["health_slowest_s"], out["health_polls"] = slowest, polls
        out["after_long_s"] = timed(url, SHORT)
        print(
            f"long prompt abandoned after 5 s: /health slowest {slowest:.2f} s over {polls} polls; "
            f"the short request after it {out['after_long_s']:.2f} s (warm {out['warm_s']:.2f} s)"
        )
    finally:
        proc.terminate()
        proc.wait(30)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "serve.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
