"""`quickdraft bench compare`: Spec-Bench's equality check with a diagnosis of every mismatch.

For each output that differs from plain decoding, the target is re-run (fresh, no cache) on the
prompt + the common prefix, and the top-2 logit margin at the first differing token is printed: a
margin within the dtype's rounding noise marks a numerics near-tie; a large one marks a bug.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from quickdraft.bench.outputs import read_rows
from quickdraft.errors import QuickdraftError

# Largest top-2 margin still called a near-tie, relative to max(1, |top-1 logit|).
NEAR_TIE = {"bfloat16": 2 * 2.0**-7, "float32": 1e-4, "float64": 1e-8}


@dataclass
class Mismatch:
    question_id: str
    run: int
    position: int
    ar_token: int
    method_token: int
    margin: float
    top5: list[int]
    near_tie: bool


def load_rows(out: Path) -> tuple[list[dict], dict]:
    rows, summary_path = read_rows(out), out / "results.json"
    if rows is None or not summary_path.is_file():
        raise QuickdraftError(f"{out} holds no benchmark results (results.jsonl or .jsonl.xz, and results.json)")
    return rows, json.loads(summary_path.read_text())


def find_mismatches(rows: list[dict], method: str, target, dtype: str) -> tuple[int, list[Mismatch]]:
    """(number of outputs compared, mismatches with their margins) for `method` against "ar" run 0."""
    ar = {r["question_id"]: r for r in rows if r["method"] == "ar" and r["run"] == 0}
    mine = [r for r in rows if r["method"] == method]
    if not mine:
        raise QuickdraftError(f"no rows for method {method!r}; methods: {sorted({r['method'] for r in rows})}")
    found = []
    for r in mine:
        ref = ar[r["question_id"]]
        a, b = ref["token_ids"], r["token_ids"]
        if a == b:
            continue
        pos = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
        if pos >= min(len(a), len(b)):  # one output is a prefix of the other (an EOS/budget difference)
            found.append(Mismatch(r["question_id"], r["run"], pos, -1, -1, float("nan"), [], False))
            continue
        with torch.inference_mode():
            logits = target(input_ids=torch.tensor([ref["prompt_ids"] + a[:pos]])).logits[0, -1].double()
        top = torch.topk(logits, 5)
        margin = float(top.values[0] - top.values[1])
        top5 = top.indices.tolist()
        tol = NEAR_TIE[dtype] * max(1.0, abs(float(top.values[0])))
        near = margin <= tol and a[pos] in top5 and b[pos] in top5
        found.append(Mismatch(r["question_id"], r["run"], pos, a[pos], b[pos], margin, top5, near))
    return len(mine), found
