"""Long prompts for `quickdraft bench --prompts FILE` (issue #79 item 4): real code that ships with Python's
standard library, whole files in a fixed order until a prompt reaches about N tokens of the Qwen2.5
tokenizer (the pair's; its window is 32,768), then a question about what was read. One line per length,
in Spec-Bench's format (category `long-<N>`). Nothing is downloaded: the files are this Python's own.

    python scripts/long_prompts.py --lengths 8000,16000,31000 --out /tmp/long.jsonl
"""

from __future__ import annotations

import argparse
import json
import sysconfig
from pathlib import Path

FILES = [  # the standard library's, in this order (each whole, with its path as a header)
    "textwrap.py", "difflib.py", "argparse.py", "dataclasses.py", "json/decoder.py", "json/encoder.py",
    "heapq.py", "bisect.py", "shlex.py", "fractions.py", "statistics.py", "inspect.py", "typing.py", "ast.py",
]  # fmt: skip
QUESTION = (
    "\n\nThe files above are from Python's standard library. In a few sentences, say what the last complete "
    "function above does and name one other function above that it resembles."
)


def tokenizer():
    """The Qwen2.5-Coder 1.5B's tokenizer, from the folder `quickdraft prepare` or the first load converts."""
    from transformers import AutoTokenizer

    from quickdraft.weights.default import named_target_dir

    folder = named_target_dir("qwen2.5-coder-1.5b")
    if not (folder / "tokenizer_config.json").is_file():
        raise SystemExit(f"no converted Qwen2.5-Coder 1.5B at {folder}: run `quickdraft generate --target "
                         "qwen2.5-coder-1.5b hi` once (the `pair` extra)")  # fmt: skip
    return AutoTokenizer.from_pretrained(folder, local_files_only=True)


def prompt_of(tokens: int, count) -> str:
    """Whole files, in FILES order, while the prompt stays within `tokens` tokens; then the question."""
    lib = Path(sysconfig.get_paths()["stdlib"])
    text, budget = "", tokens - count(QUESTION) - 40  # the chat template's tokens
    for name in FILES:
        part = f"# file: Lib/{name}\n{(lib / name).read_text()}\n"
        if count(text + part) > budget:
            lines = part.splitlines(keepends=True)  # the last file cut at a line so the prompt is full
            lo, hi = 0, len(lines)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                lo, hi = (mid, hi) if count(text + "".join(lines[:mid])) <= budget else (lo, mid - 1)
            return text + "".join(lines[:lo]) + QUESTION
        text += part
    raise SystemExit(f"the standard library files listed hold fewer than {tokens} tokens")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", default="8000,16000,31000", help="prompt lengths in tokens, comma-separated")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    tok = tokenizer()
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    with open(args.out, "w") as f:
        for n in (int(x) for x in args.lengths.split(",")):
            text = prompt_of(n, count)
            f.write(json.dumps({"question_id": f"long-{n}", "category": f"long-{n}", "turns": [text]}) + "\n")
            print(f"long-{n}: {count(text):,} tokens", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
