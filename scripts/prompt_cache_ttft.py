"""Time to first token when prompts come back (issue #79 item 5): --chats interleaved chats of --turns
turns each (each turn's prompt: the chat so far, its answers included, and a new user message), then a
--keystrokes-keystroke FIM session (a standard-library file's code before and after the cursor, the
prefix growing by one character a keystroke), on `quickdraft serve` and on llama.cpp with its RAM prompt
cache (llama-cpp-python's `LlamaRAMCache`, what its server keeps), both fed the same token ids.

The time to first token is from sending a request to its first streamed text; the cached prompt tokens
are what `usage.prompt_tokens_details.cached_tokens` reports (ours). One process at a time: the server
runs first and stops, then llama.cpp runs. Writes report.json.

    python scripts/prompt_cache_ttft.py --out docs/bench/prompt-cache-amx -- --threads 2
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import httpx
from load_test import start_server, wait_ready  # this folder: run as a script

OPENERS = [
    "Explain how a hash map handles collisions.",
    "Write a short poem about the sea at night.",
    "What causes the seasons on Earth?",
    "Give three tips for writing clear commit messages.",
]
FOLLOW_UPS = ["Tell me more.", "Give an example.", "Why?", "Summarize that in one line.", "And the opposite case?"]


def user_turns(chats: int, turns: int) -> list[list[str]]:
    """Each chat's user messages, turn by turn."""
    return [[OPENERS[c % len(OPENERS)], *(FOLLOW_UPS[(c + t) % len(FOLLOW_UPS)] for t in range(turns - 1))]
            for c in range(chats)]  # fmt: skip


def fim_states(keystrokes: int, before: int = 3000, after: int = 600) -> list[tuple[str, str]]:
    """(prefix, suffix) at each keystroke: a standard-library file cut at a cursor that moves right."""
    text = Path(inspect.getsourcefile(json.decoder)).read_text()
    return [(text[: before + i], text[before + i : before + i + after]) for i in range(keystrokes)]


def ours(server_args: list[str], chats: list[list[str]], fims, max_tokens: int) -> dict:
    proc, url = start_server(server_args)
    try:
        wait_ready(url, proc, 1800)
        history = [[] for _ in chats]
        turns = []
        for t in range(len(chats[0])):
            for c, said in enumerate(chats):
                history[c].append({"role": "user", "content": said[t]})
                body = {"messages": history[c], "max_tokens": max_tokens, "temperature": 0}
                text, first, cached = stream(url + "/v1/chat/completions", body)
                history[c].append({"role": "assistant", "content": text})
                turns.append({"chat": c, "turn": t + 1, "first_s": first, "cached": cached})
        keys = []
        for prefix, suffix in fims:
            body = {"prompt": prefix, "suffix": suffix, "max_tokens": 16, "temperature": 0}
            _, first, cached = stream(url + "/v1/completions", body)
            keys.append({"first_s": first, "cached": cached})
        return {"chat": turns, "fim": keys, "histories": history}
    finally:
        proc.terminate()
        proc.wait(60)


def stream(url: str, body: dict) -> tuple[str, float | None, int]:
    """(text, seconds to the first streamed text, cached prompt tokens) of one streamed request."""
    body = body | {"stream": True, "stream_options": {"include_usage": True}}
    start, first, parts, cached = time.perf_counter(), None, [], 0
    with httpx.Client(timeout=900) as http, http.stream("POST", url, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            obj = json.loads(line[6:])
            for choice in obj.get("choices", []):
                piece = choice.get("delta", {}).get("content") if "delta" in choice else choice.get("text")
                if piece:
                    first = first or time.perf_counter() - start
                    parts.append(piece)
            if obj.get("usage"):
                cached = obj["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
    return "".join(parts), first, cached


def llama_cpp(gguf: str, codec, chats: list[list[str]], fims, max_tokens: int, threads: int) -> dict:
    """llama.cpp on the same chats (its own answers in its own histories) and keystrokes, each prompt's
    ids made by our tokenizer and chat template."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=gguf, n_ctx=8192, n_threads=threads, verbose=False)
    llm.set_cache(llama_cpp.LlamaRAMCache(capacity_bytes=8 << 30))

    def run(ids: list[int], n: int) -> tuple[str, float | None]:
        start, first, parts = time.perf_counter(), None, []
        for chunk in llm.create_completion(ids, max_tokens=n, temperature=0, stream=True):  # whole: it is cached
            first = first or time.perf_counter() - start
            parts.append(chunk["choices"][0]["text"])
        return "".join(parts), first

    history, turns = [[] for _ in chats], []
    for t in range(len(chats[0])):
        for c, said in enumerate(chats):
            history[c].append({"role": "user", "content": said[t]})
            text, first = run(codec.encode(history[c]), max_tokens)
            history[c].append({"role": "assistant", "content": text})
            turns.append({"chat": c, "turn": t + 1, "first_s": first})
    keys = [{"first_s": run(codec.encode_fim(prefix, suffix), 16)[1]} for prefix, suffix in fims]
    return {"chat": turns, "fim": keys}


def summary(run: dict, turns: int) -> dict:
    last = [r["first_s"] for r in run["chat"] if r["turn"] == turns]
    fim = [r["first_s"] for r in run["fim"]]
    return {"turn_last_first_s": last, "turn_last_max_s": max(last), "fim_median_s": statistics.median(fim),
            "fim_last_s": fim[-1]}  # fmt: skip


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default="qwen2.5-coder-1.5b")
    p.add_argument("--chats", type=int, default=4)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--keystrokes", type=int, default=20)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", required=True)
    p.add_argument("server_args", nargs="*", help="after --: more `quickdraft serve` flags")
    args = p.parse_args()
    from quickdraft.host import machine_info
    from quickdraft.prompts import PromptCodec
    from quickdraft.weights.default import converted_target
    from quickdraft.weights.loading import load_model

    chats, fims = user_turns(args.chats, args.turns), fim_states(args.keystrokes)
    report = {"machine": machine_info(), "target": args.target, "chats": args.chats, "turns": args.turns}
    report["ours"] = ours(["--target", args.target, *args.server_args], chats, fims, args.max_tokens)
    loaded = load_model(args.target)
    codec = PromptCodec(loaded.tokenizer, loaded.vocab_size, 32768)
    gguf = str(converted_target(args.target)[2])
    report["llama_cpp"] = llama_cpp(gguf, codec, chats, fims, args.max_tokens, args.threads)
    report["summary"] = {k: summary(report[k], args.turns) for k in ("ours", "llama_cpp")}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
