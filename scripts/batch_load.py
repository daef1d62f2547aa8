"""Concurrency sweep of `quickdraft serve` with continuous batching: aggregate tokens/s and latency
against the number of concurrent clients, ours beside plain batched decoding (issue #28).

For each server configuration (a label and `quickdraft serve` flags) it starts a fresh server on a
free loopback port, waits for /health and warms up. Then, at each concurrency level N, the same
--requests chat requests (different Spec-Bench prompts: one per category, then file order;
--max-tokens each, greedy, every other one streamed) are sent by N client threads, each sending its
share one after another: N = 1 is every request alone, one at a time; N = --requests sends all at
once. Per level: every status, aggregate tokens/s (completion tokens / the level's wall time), each
request's latency (p50, max), /metrics after the level, and how many answers are the same text as the
same request's alone (N = 1; greedy: each stream's text must not depend on the rows beside it), and the
server's resident and peak memory (/health) after the level. The
server stops afterwards; the run stops by itself. Writes report.json and load.png (throughput and p50
latency against concurrency).

    python scripts/batch_load.py --out docs/bench/batch-load -- --threads 2
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from load_test import start_server, wait_ready  # this folder: run as a script

CONFIGS = {"ours": [], "plain batched (ar)": ["--method", "ar"]}


def spec_bench_prompts(path: str, n: int) -> list[str]:
    """The first turn of one question per category, then the rest in file order: n different prompts."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    seen, first, rest = set(), [], []
    for row in rows:
        (rest if row["category"] in seen else first).append(row["turns"][0])
        seen.add(row["category"])
    return (first + rest)[:n]


def one_request(url: str, prompt: str, max_tokens: int, stream: bool) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    start = time.perf_counter()
    try:
        with httpx.Client(timeout=900) as http:
            if not stream:
                r = http.post(url + "/v1/chat/completions", json=body)
                ok = r.status_code == 200
                tokens = r.json()["usage"]["completion_tokens"] if ok else 0
                text = r.json()["choices"][0]["message"]["content"] if ok else None
                return {"status": r.status_code, "tokens": tokens, "latency": time.perf_counter() - start, "text": text}
            body |= {"stream": True, "stream_options": {"include_usage": True}}
            tokens, first, status, parts = 0, None, None, []
            with http.stream("POST", url + "/v1/chat/completions", json=body) as r:
                status = r.status_code
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        obj = json.loads(line[6:])
                        first = first or time.perf_counter() - start
                        if obj.get("usage"):
                            tokens = obj["usage"]["completion_tokens"]
                        for choice in obj.get("choices", []):
                            parts.append(choice.get("delta", {}).get("content") or "")
            latency = time.perf_counter() - start
            return {"status": status, "tokens": tokens, "latency": latency, "first_s": first, "text": "".join(parts)}
    except httpx.HTTPError as exc:
        return {"status": str(exc), "tokens": 0, "latency": time.perf_counter() - start}


def metric(url: str, name: str) -> float | None:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return None


def sweep(server_args: list[str], prompts: list[str], levels: list[int], max_tokens: int) -> dict:
    """Start a server with `server_args`, run every level, stop it; the levels' results."""
    proc, url = start_server(server_args)
    try:
        wait_ready(url, proc, 600)
        one_request(url, "Say hello.", 8, False)  # warm-up
        out = {"max_batch": metric(url, "quickdraft:max_batch_size"), "levels": []}
        for n in levels:
            start = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                jobs = [(p, max_tokens, i % 2 == 1) for i, p in enumerate(prompts)]
                rows = list(pool.map(lambda job: one_request(url, *job), jobs))
            wall = time.perf_counter() - start
            lat = [r["latency"] for r in rows if r["status"] == 200]
            level = {
                "concurrency": n,
                "ok": sum(r["status"] == 200 for r in rows),
                "errors": sum(r["status"] != 200 for r in rows),
                "wall_s": round(wall, 3),
                "tokens": sum(r["tokens"] for r in rows),
                "tokens_per_s": round(sum(r["tokens"] for r in rows) / wall, 2),
                "latency_p50_s": round(statistics.median(lat), 3) if lat else None,
                "latency_max_s": round(max(lat), 3) if lat else None,
                "pending_after": metric(url, "quickdraft:num_requests_pending"),
                "server_memory_mib": {k: v for k, v in httpx.get(url + "/health").json().items() if k != "status"},
                "rows": rows,
            }
            print(json.dumps({k: v for k, v in level.items() if k != "rows"}), flush=True)
            out["levels"].append(level)
        return out
    finally:
        proc.terminate()
        proc.wait(60)


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for label, res in report["configs"].items():
        xs = [lv["concurrency"] for lv in res["levels"]]
        a.plot(xs, [lv["tokens_per_s"] for lv in res["levels"]], marker="o", label=label)
        b.plot(xs, [lv["latency_p50_s"] for lv in res["levels"]], marker="o", label=label)
    for ax, title in ((a, "aggregate tokens/s"), (b, "p50 latency (s)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"quickdraft serve, {report['max_tokens']} tokens per request, {report['host']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", default="../shared/data/spec_bench/question.jsonl")
    p.add_argument("--levels", default="1,2,4,8,16")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--configs", default=",".join(CONFIGS), help="which of: " + ", ".join(CONFIGS))
    p.add_argument("--out", required=True, help="a folder for report.json and load.png")
    args = p.parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    prompts = spec_bench_prompts(args.prompts, args.requests)
    import torch

    from quickdraft.host import cpu_model

    host = f"{cpu_model()}, {torch.backends.cpu.get_cpu_capability()}, {platform.machine()}"
    report = {"host": host, "max_tokens": args.max_tokens, "server_args": extra, "configs": {}}
    for label in args.configs.split(","):
        report["configs"][label] = sweep(CONFIGS[label] + extra, prompts, levels, args.max_tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(report, out / "load.png")
    for res in report["configs"].values():  # each level against the requests alone (N = 1)
        alone = next((lv for lv in res["levels"] if lv["concurrency"] == 1), None)
        for lv in res["levels"]:
            if alone:  # greedy: the same text as alone, request by request
                same = [a["text"] == b["text"] for a, b in zip(alone["rows"], lv["rows"], strict=True)]
                lv["same_text_as_alone"] = f"{sum(same)}/{len(same)}"
            if alone and lv["latency_p50_s"] and alone["latency_p50_s"]:
                lv["throughput_vs_alone"] = round(lv["tokens_per_s"] / alone["tokens_per_s"], 2)
                lv["p50_latency_vs_alone"] = round(lv["latency_p50_s"] / alone["latency_p50_s"], 2)
    (out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    errors = sum(lv["errors"] for res in report["configs"].values() for lv in res["levels"])
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
