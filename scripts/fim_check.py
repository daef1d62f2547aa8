"""Fill-in-the-middle on a real pair, checked by running the programs (issue #71's goal).

    python scripts/fim_check.py --target qwen2.5-coder-1.5b --threads 2 --out docs/bench/fim-pair

Each case is a small HumanEval-style function with a gap: the prefix before it and the suffix after it
(asserts included). The engine (the target's defaults: its own blocks, its known draft) generates the
middle greedily from the model's FIM prompt (`PromptCodec.encode_fim`, ended at its FIM stop tokens, as the server's
`suffix` field does); prefix + middle + suffix is then run in a fresh interpreter, and a case passes when it exits 0.
Writes `fim.json` (each case's middle, pass, tokens, tokens per forward) to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from quickdraft.engine import Engine
from quickdraft.settings.options import options_from, request_from

CASES = [
    ("def add(a, b):\n    return ", "\n\n\nassert add(2, 3) == 5\n"),
    ("def is_even(n):\n    ", "\n\n\nassert is_even(4) and not is_even(7)\n"),
    (
        "def fib(n):\n    if n < 2:\n        return n\n    ",
        "\n\n\nassert [fib(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]\n",
    ),
    (
        "def reverse_words(s):\n    words = s.split()\n    ",
        "\n    return ' '.join(words)\n\n\nassert reverse_words('a b c') == 'c b a'\n",
    ),
    ("def count_vowels(s):\n    ", "\n\n\nassert count_vowels('hello world') == 3\n"),
    (
        "def running_max(xs):\n    out, best = [], None\n    for x in xs:\n        ",
        "\n        out.append(best)\n    return out\n\n\nassert running_max([1, 3, 2, 5]) == [1, 3, 3, 5]\n",
    ),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("runs/fim"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = Engine.load(config=options_from({"target": args.target}))
    rows = []
    for prefix, suffix in CASES:
        ids = engine.prompts.encode_fim(prefix, suffix)
        eos = engine.prompts.fim_stop_ids(engine.target_info.eos_token_ids)
        request = request_from({"max_new_tokens": args.max_new_tokens})  # greedy, ended as the server ends it
        out = engine.generate_ids(ids, request.sampling, request.stop_config(eos))
        program = prefix + out.text + suffix
        run = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=30)
        s = out.stats
        rows.append(
            {
                "prefix": prefix,
                "suffix": suffix,
                "middle": out.text,
                "passed": run.returncode == 0,
                "new_tokens": s.num_new_tokens,
                "tokens_per_forward": s.num_new_tokens / max(1, s.num_target_forwards),
                "tokens_per_s": s.tokens_per_s,
            }
        )
        print(f"{'PASS' if run.returncode == 0 else 'FAIL'} {prefix.splitlines()[0]!r}: {out.text!r}")
    passed = sum(r["passed"] for r in rows)
    print(f"{passed}/{len(rows)} programs run; ran: {engine.ran()}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fim.json").write_text(json.dumps({"ran": engine.ran(), "cases": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
