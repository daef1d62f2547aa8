"""Pure metric functions over benchmark rows (dicts as written to results.jsonl).

tokens/s is sum(new tokens) / sum(wall seconds) over a group; speedup_vs_ar divides a method's
tokens/s by plain decoding's over the same prompts and runs; mean_accepted_tokens is Spec-Bench's
tokens per target forward (1.00 for plain decoding; prefill forward included). A method on a quantized
target (`quantize=...`) also gets speedup_vs_own_ar: over plain decoding of the same quantized weights.
"""

from __future__ import annotations

import statistics
from collections import defaultdict


def _rate(flags: list) -> float | None:
    """The share of true flags; 0.0 for none; None when every flag is None (sampled rows)."""
    known = [bool(f) for f in flags if f is not None]
    if not known:
        return None if flags else 0.0
    return sum(known) / len(known)


def _sum(rows: list[dict], key: str) -> float:
    return float(sum(r[key] for r in rows))


def _positions(rows: list[dict], key: str) -> list[int]:
    out: list[int] = []
    for r in rows:
        for i, v in enumerate(r.get(key) or []):
            if i == len(out):
                out.append(0)
            out[i] += v
    return out


def tokens_per_s(rows: list[dict]) -> float:
    wall = _sum(rows, "wall_s")
    return _sum(rows, "new_tokens") / wall if wall > 0 else 0.0


def prefill_rate(rows: list[dict]) -> float | None:
    """Prompt tokens a second of prefill (to the first token), over the rows that timed it apart."""
    timed = [r for r in rows if r.get("prefill_s")]
    seconds = _sum(timed, "prefill_s")
    return _sum(timed, "prompt_tokens") / seconds if timed and seconds > 0 else None


def group_metrics(rows: list[dict], ar_rows: list[dict]) -> dict:
    """Metrics of one method over `rows`, against plain decoding's `ar_rows` on the same prompts."""
    runs = sorted({r["run"] for r in rows})
    per_run_tps = [tokens_per_s([r for r in rows if r["run"] == k]) for k in runs]
    per_run_speedup = []
    for k in runs:
        base = tokens_per_s([r for r in ar_rows if r["run"] == k])
        per_run_speedup.append(tokens_per_s([r for r in rows if r["run"] == k]) / base if base else 0.0)
    drafted, accepted = _sum(rows, "num_draft_tokens"), _sum(rows, "num_accepted")
    drafts = _sum(rows, "num_drafts")
    dpos, apos = _positions(rows, "drafted_per_position"), _positions(rows, "accepted_per_position")
    forwards = _sum(rows, "target_forwards")
    drafted_share = _drafted_share(rows)
    return {
        "num_prompts": len({r["question_id"] for r in rows}),
        "runs": len(runs),
        "new_tokens": int(_sum(rows, "new_tokens")),
        "tokens_per_s": tokens_per_s(rows),
        "prefill_tokens_per_s": prefill_rate(rows),
        "tokens_per_s_std": statistics.stdev(per_run_tps) if len(per_run_tps) > 1 else 0.0,
        "speedup_vs_ar": statistics.mean(per_run_speedup) if per_run_speedup else 0.0,
        "speedup_vs_ar_std": statistics.stdev(per_run_speedup) if len(per_run_speedup) > 1 else 0.0,
        "mean_accepted_tokens": _sum(rows, "new_tokens") / forwards if forwards else 0.0,
        "num_draft_tokens": int(drafted),
        "num_accepted_draft_tokens": int(accepted),
        "draft_acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_acceptance_length": 1.0 + accepted / drafts if drafts else 1.0,
        "acceptance_rate_per_position": [a / d if d else 0.0 for a, d in zip(apos, dpos, strict=True)],
        "swi": _swi(rows),
        # None for a sampled method (its rows' match_ar is None: no one output is expected)
        "lossless_match_rate": _rate([r["match_ar"] for r in rows]),
        # other weights (quantized, llama.cpp's): how often the output equals our plain decoding's
        "agreement_with_ar": _rate([r.get("agrees_ar", r["match_ar"]) for r in rows]),
        # PEARL's own "mean accepted tokens": tokens per run of accepts ending at a rejection
        # (correction included). Not comparable with mean_accepted_tokens (per target forward).
        "pearl_mean_accepted_tokens": _extra_ratio(rows, "pearl_run_tokens", "pearl_runs"),
        # token trees: nodes per drafted tree, and how deep the accepted path went (rounds per depth)
        "tree_mean_nodes": _extra_ratio(rows, "tree_nodes", "tree_rounds"),
        "tree_accepted_depth_histogram": _depth_histogram(rows),
        # the draft guard (decoding/guard.py): the share of decode rounds (prefill excluded) that
        # drafted; None when the guard never kept a round plain
        "drafted_round_share": drafted_share,
        # this host's cost model declined to draft: the auto budget chose plain decoding, or the guard
        # kept every round plain (a drafter slower than the target's step, e.g. on a tiny target)
        "speculation_declined": (bool(rows) and all(r.get("extra", {}).get("tree_auto_no_speculation") for r in rows))
        or drafted_share == 0.0,
    }


def _drafted_share(rows: list[dict]) -> float | None:
    plain = sum(r.get("extra", {}).get("guard_plain_rounds", 0) for r in rows)
    rounds = sum(max(0, r["target_forwards"] - 1) for r in rows)
    return 1.0 - plain / rounds if plain and rounds else None


def _swi(rows: list[dict]) -> float | None:
    """CS Drafting's standardized walltime improvement (bench/cost.py); None when not counted."""
    if not rows or any(r.get("draft_cost_units") is None for r in rows):
        return None
    cost = sum(r["target_forwards"] + r["draft_cost_units"] for r in rows)
    return _sum(rows, "new_tokens") / cost if cost else None


def _depth_histogram(rows: list[dict]) -> list[int] | None:
    counts: dict[int, int] = {}
    for r in rows:
        for key, value in (r.get("extra") or {}).items():
            if key.startswith("accepted_depth_"):
                depth = int(key.rsplit("_", 1)[1])
                counts[depth] = counts.get(depth, 0) + value
    return [counts.get(d, 0) for d in range(max(counts) + 1)] if counts else None


def _extra_ratio(rows: list[dict], num: str, den: str) -> float | None:
    d = sum(r.get("extra", {}).get(den, 0) for r in rows)
    return sum(r.get("extra", {}).get(num, 0) for r in rows) / d if d else None


def summarize(rows: list[dict], ar_method: str = "ar") -> dict:
    """{"methods": {METHOD: {...overall..., "categories": {CATEGORY: {...}}}}} from all rows."""
    by_method: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_method[r["method"]].append(r)
    ar_rows = by_method.get(ar_method, [])
    out: dict = {"methods": {}}
    for method, mrows in by_method.items():
        entry = group_metrics(mrows, ar_rows)
        cats: dict[str, dict] = {}
        for cat in sorted({r["category"] for r in mrows}):
            cats[cat] = group_metrics(
                [r for r in mrows if r["category"] == cat], [r for r in ar_rows if r["category"] == cat]
            )
        entry["categories"] = cats
        weights = mrows[0].get("quantize", "none")
        if weights != "none":  # a quantized target: its speedup over plain decoding of the same weights too
            own = [r for r in rows if r.get("quantize") == weights and r.get("plain", r["method"].startswith("ar"))]
            entry["quantize"] = weights
            entry["speedup_vs_own_ar"] = group_metrics(mrows, own)["speedup_vs_ar"] if own else None
        out["methods"][method] = entry
    return out
