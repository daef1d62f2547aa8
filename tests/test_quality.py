"""Lossy-method quality (bench/quality.py): HumanEval execution both ways, ROUGE-L, exact match."""

import json

import pytest

from quickdraft.bench.quality import extract_code, humaneval_problems, passes, quality, render

RIGHT = """Here it is:
```python
def has_close_elements(numbers, threshold):
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
```"""
WRONG = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"


def test_extract_code():
    assert extract_code(RIGHT).startswith("def has_close_elements")
    assert extract_code("x = 1") == "x = 1"


def test_humaneval_execution_can_pass_and_fail():
    problem = humaneval_problems()["HumanEval/0"]
    assert passes(problem, RIGHT) and not passes(problem, WRONG)


def test_quality_table(tmp_path):
    pytest.importorskip("rouge_score")
    rows = [
        {"question_id": "HumanEval/0", "category": "summarization", "method": m, "run": 0, "token_ids": ids}
        for m, ids in (("ar", [1, 2, 3]), ("sd:verifier=x", [1, 2, 4]))
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "results.json").write_text(json.dumps({"config": {"prompts": "humaneval"}}))
    texts = {(1, 2, 3): RIGHT, (1, 2, 4): WRONG}
    result = quality(tmp_path, lambda ids: texts[tuple(ids)])
    assert result["ar"]["humaneval_pass_at_1"] == 1.0 and result["sd:verifier=x"]["humaneval_pass_at_1"] == 0.0
    assert result["ar"]["rouge_l_vs_ar"] == 1.0 > result["sd:verifier=x"]["rouge_l_vs_ar"]
    assert result["sd:verifier=x"]["exact_match"] == 0.0
    assert "HumanEval pass@1" in render(result)
