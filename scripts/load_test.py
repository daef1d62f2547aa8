"""Bounded load test of `quickdraft serve` on 127.0.0.1: requests/s, tokens/s, p50/p99 latency, errors.

Starts its own server (any `quickdraft serve` flags after `--`) on a free loopback port, or targets
--url. Sends --requests requests from --concurrency client threads, mixing streaming and
non-streaming chat requests; a --cancel fraction of streams is dropped after the first chunk.
429 answers are retried after Retry-After and counted separately (back-pressure is not an error).

    python scripts/load_test.py --requests 24 --concurrency 4 --max-tokens 32 -- --drafter ngram --threads 2
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

PROMPTS = [
    "Write a Python function that reverses a string, then show an example call.",
    "List three facts about the Moon.",
    "Summarize: The meeting moved to Tuesday because the room was booked on Monday.",
    "Explain what a cache is in two sentences.",
    "Translate to French: good morning, how are you?",
    "Give a short recipe for pancakes.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(server_args: list[str]) -> tuple[subprocess.Popen, str]:
    """`quickdraft serve` with `server_args` on a free loopback port: (the process, its URL)."""
    port = free_port()
    cmd = [sys.executable, "-m", "quickdraft.cli", "serve", "--port", str(port), *server_args]
    return subprocess.Popen(cmd), f"http://127.0.0.1:{port}"


def wait_ready(url: str, proc: subprocess.Popen | None, timeout_s: float) -> None:
    """Wait until /health answers 200; exit if the server process died or `timeout_s` passed."""
    end = time.time() + timeout_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.time() > end or (proc is not None and proc.poll() is not None):
            raise SystemExit("server did not become ready")
        time.sleep(0.5)


def one_request(url: str, i: int, args) -> dict:
    rng = random.Random(i)
    stream = rng.random() < args.stream_fraction
    cancel = stream and rng.random() < args.cancel
    body = {
        "messages": [{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    start, retries = time.perf_counter(), 0
    with httpx.Client(timeout=600) as http:
        while True:
            try:
                if not stream:
                    r = http.post(url + "/v1/chat/completions", json=body)
                    if r.status_code == 429:
                        retries += 1
                        time.sleep(float(r.headers.get("retry-after", 1)))
                        continue
                    tokens = r.json()["usage"]["completion_tokens"] if r.status_code == 200 else 0
                    return {
                        "ok": r.status_code == 200,
                        "status": r.status_code,
                        "tokens": tokens,
                        "latency": time.perf_counter() - start,
                        "retries": retries,
                        "cancelled": False,
                    }
                with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
                    if r.status_code == 429:
                        retries += 1
                        time.sleep(float(r.headers.get("retry-after", 1)))
                        continue
                    tokens, done = 0, False
                    for line in r.iter_lines():
                        if cancel and line.startswith("data: {"):
                            return {
                                "ok": True,
                                "status": r.status_code,
                                "tokens": 0,
                                "cancelled": True,
                                "latency": time.perf_counter() - start,
                                "retries": retries,
                            }
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            obj = json.loads(line[6:])
                            if "error" in obj:
                                break
                            if obj.get("usage"):
                                tokens = obj["usage"]["completion_tokens"]
                    return {
                        "ok": r.status_code == 200 and done,
                        "status": r.status_code,
                        "tokens": tokens,
                        "latency": time.perf_counter() - start,
                        "retries": retries,
                        "cancelled": False,
                    }
            except httpx.HTTPError as exc:
                return {
                    "ok": False,
                    "status": str(exc),
                    "tokens": 0,
                    "latency": time.perf_counter() - start,
                    "retries": retries,
                    "cancelled": cancel,
                }


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def main() -> int:
    argv = sys.argv[1:]
    server_args = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default=None, help="an already running server (default: start one)")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--stream-fraction", type=float, default=0.5)
    p.add_argument("--cancel", type=float, default=0.1, help="fraction of streams dropped after one chunk")
    p.add_argument("--json", default=None, help="also write the report here")
    args = p.parse_args(argv)

    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(server_args)
    try:
        wait_ready(url, proc, 300)
        one_request(url, 10_000, argparse.Namespace(**{**vars(args), "stream_fraction": 0, "cancel": 0}))  # warm-up
        start = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(lambda i: one_request(url, i, args), range(args.requests)))
        wall = time.perf_counter() - start
        metrics = httpx.get(url + "/metrics").text
        pending = [line for line in metrics.splitlines() if line.startswith("quickdraft:num_requests_pending")]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    done = [r for r in results if r["ok"] and not r["cancelled"]]
    latencies = [r["latency"] for r in done]
    report = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "completed": len(done),
        "cancelled": sum(r["cancelled"] for r in results),
        "errors": sum(not r["ok"] for r in results),
        "retries_after_429": sum(r["retries"] for r in results),
        "wall_s": wall,
        "requests_per_s": len(done) / wall,
        "tokens_per_s": sum(r["tokens"] for r in done) / wall,
        "latency_p50_s": percentile(latencies, 0.5),
        "latency_p99_s": percentile(latencies, 0.99),
        "mean_latency_s": statistics.mean(latencies) if latencies else 0.0,
        "pending_after": pending[0] if pending else None,
        "server_args": server_args,
    }
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
