"""Every GGUF type against llama.cpp on the same file (issue #80's goal): the pair's 0.5B requantized by
llama.cpp's own quantizer to each type (`llama_cpp_peer.quantized_copy`), then one `quickdraft bench` per
file with our plain decoding (`ar`, the file's blocks as stored) and llama.cpp's (`llama-cpp`), in that
order on the same prompts; a table of tokens/s and their ratio, and a bar plot.

    python scripts/gguf_types.py --out docs/bench/gguf-types-amx [--model qwen2.5-coder-1.5b] [--types q2_k,q8_0] \
        -- --threads 2

Everything after `--` goes to `quickdraft bench`. A type whose run exists under --out is read, not rerun
(a long run resumes where it stopped).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from quickdraft.bench.peers.llama_cpp_peer import quantized_copy
from quickdraft.host import machine_info
from quickdraft.weights.default import named_gguf

TYPES = ("q2_k", "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "q8_0", "iq4_xs")
BENCH = ["--runs", "1", "--prompts", "humaneval", "--limit", "8", "--max-new-tokens", "64", "--methods", "ar,llama-cpp"]


def linear_types(path: Path) -> str:
    """The file's linears by block type, most first ("Q5_0 x96, Q4_K x12")."""
    from gguf import GGUFReader

    counts: dict[str, int] = {}
    for t in GGUFReader(path).tensors:
        if t.name.startswith("blk.") and t.name.endswith(".weight") and len(t.shape) == 2:
            counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def run_type(quant: str, out: Path, extra: list[str], model: str = "qwen2.5-coder-0.5b") -> dict:
    """{method: tokens/s} of one file's bench (run once; read back after), and the file's linears' types."""
    folder = out / quant
    target = quantized_copy(named_gguf(model), quant)
    if not (folder / "results.json").exists():
        cmd = [sys.executable, "-m", "quickdraft.cli", "bench", "--target", str(target), *BENCH, *extra]
        print(f"[{quant}] {' '.join(cmd[2:])}", flush=True)
        subprocess.run([*cmd, "--out", str(folder)], check=True)
    methods = json.loads((folder / "results.json").read_text())["methods"]
    return {name: m["tokens_per_s"] for name, m in methods.items()} | {
        "matches": methods["llama-cpp"].get("agreement_with_ar"),
        "types": linear_types(target),
    }


def plot(rows: dict[str, dict], path: Path, model: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    fig, ax = plt.subplots(figsize=(8, 3.5))
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [rows[n]["ar"] for n in names], 0.4, label="quickdraft ar")
    ax.bar([x + 0.2 for x in xs], [rows[n]["llama-cpp"] for n in names], 0.4, label="llama.cpp")
    ax.set_xticks(list(xs), [n.upper() for n in names])
    ax.set_ylabel("tokens/s (plain decoding)")
    ax.set_title(f"{model}, one file per type, same prompts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--types", default=",".join(TYPES))
    ap.add_argument("--model", default="qwen2.5-coder-0.5b", help="the named GGUF requantized (its shapes: the types)")
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {q: run_type(q, args.out, extra, args.model) for q in args.types.split(",")}
    host = machine_info()
    lines = [
        f"# Every GGUF type against llama.cpp on the same file: {args.model} requantized by llama.cpp "
        f"({host['cpu']}, {' '.join(host['cpu_flags'])})",
        "",
        f"`python scripts/gguf_types.py --model {args.model} --out {args.out} -- {' '.join(extra)}`: per type, "
        f"`quickdraft bench --target FILE {' '.join(BENCH)} {' '.join(extra)}`.",
        "",
        "| file | its layers' linears | our ar tokens/s | llama.cpp tokens/s | ours / llama.cpp | outputs equal |",
        "|---|---|---|---|---|---|",
    ]
    for q, r in rows.items():
        ratio = r["ar"] / r["llama-cpp"]
        row = f"| {q.upper()} | {r['types']} | {r['ar']:.2f} | {r['llama-cpp']:.2f} | {ratio:.2f}x | {r['matches']} |"
        lines.append(row)
    (args.out / "report.md").write_text("\n".join(lines) + "\n")
    plot(rows, args.out / "types.png", args.model)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
