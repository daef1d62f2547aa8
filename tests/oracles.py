"""Slow, obviously-correct references and deliberately broken variants, used only by tests."""

from __future__ import annotations

from collections.abc import Hashable, Mapping

import torch
from scipy.stats import chisquare

from quickdraft.sampling import sample
from quickdraft.types import Verdict
from quickdraft.verifiers.base import Verifier

# A negative control whose broken rule fails its law test by p < 1e-150 at the test's N (most by p = 0)
# runs on N // CONTROL_SHARE generations: the chi-square statistic of a fixed wrong law grows with N, so a
# rule that fails at N/4 (p below 1e-36 in every such control, docs/benchmarks.md, stop 60) fails at N.
# Controls with smaller margins keep N.
CONTROL_SHARE = 4


def law_pvalue(counts: Mapping[Hashable, int], law: Mapping[Hashable, float], n: int) -> tuple[float, int]:
    """(chi-square p-value, cells kept apart) of n outcomes' counts against their exact law, the outcomes
    expected under 5 times pooled into one cell: one draw of a 1-in-10^5 outcome must not decide a test."""
    big = [s for s in sorted(law, key=law.get, reverse=True) if law[s] * n >= 5]
    observed = [counts.get(s, 0) for s in big] + [n - sum(counts.get(s, 0) for s in big)]
    expected = [law[s] * n for s in big] + [n * (1 - sum(law[s] for s in big))]
    return float(chisquare(observed, expected).pvalue), len(big)


class Named(Verifier):
    """A broken verifier function under test (a negative control) as a verifier, labelled lossy."""

    lossy = True

    def __init__(self, fn) -> None:
        self.fn, self.name = fn, fn.__name__

    def __call__(self, *args) -> Verdict:
        return self.fn(*args)


def naive_prompt_lookup(context: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    """Python-loop twin of drafters.ngram.prompt_lookup."""
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(context):
            continue
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == suffix:
                return context[start + n : start + n + k]
    return []


def naive_forward_logits(model, tokens: list[int]) -> torch.Tensor:
    """Full recompute without any cache: (T, V) logits."""
    with torch.inference_mode():
        return model(input_ids=torch.tensor([tokens])).logits[0]


def naive_greedy(model, prompt: list[int], max_new_tokens: int, eos: int | None = None) -> list[int]:
    """Plain greedy decoding by full recompute every step (the slowest obvious way)."""
    ids, out = list(prompt), []
    for _ in range(max_new_tokens):
        token = int(naive_forward_logits(model, ids)[-1].argmax())
        ids.append(token)
        out.append(token)
        if token == eos:
            break
    return out


# --- broken verifiers (negative controls: the statistical tests must reject them) ----------------


def _one_row(draft_tokens, q_probs, p_probs, generator, accept_fn, next_fn) -> Verdict:
    B, k = draft_tokens.shape
    n_out, t_out = [], []
    for b in range(B):
        n = 0
        while n < k and accept_fn(b, n, draft_tokens, q_probs, p_probs, generator):
            n += 1
        n_out.append(n)
        t_out.append(next_fn(b, n, draft_tokens, q_probs, p_probs, generator))
    return Verdict(torch.tensor(n_out), torch.tensor(t_out))


def always_accept(draft_tokens, q_probs, p_probs, generator) -> Verdict:
    return _one_row(
        draft_tokens,
        q_probs,
        p_probs,
        generator,
        lambda b, i, d, q, p, g: True,
        lambda b, n, d, q, p, g: int(sample(p[b, n], g)),
    )


def resample_from_target(draft_tokens, q_probs, p_probs, generator) -> Verdict:
    """Correct acceptance but the correction token comes from p instead of the residual."""

    def accept(b, i, d, q, p, g):
        qd = 1.0 if q is None else float(q[b, i, d[b, i]])
        return float(torch.rand((), generator=g, dtype=torch.float64)) < float(p[b, i, d[b, i]]) / qd

    return _one_row(draft_tokens, q_probs, p_probs, generator, accept, lambda b, n, d, q, p, g: int(sample(p[b, n], g)))


def residual_without_clamp(draft_tokens, q_probs, p_probs, generator) -> Verdict:
    """Correct acceptance but the residual uses |p - q| instead of max(0, p - q)."""

    def accept(b, i, d, q, p, g):
        qd = 1.0 if q is None else float(q[b, i, d[b, i]])
        return float(torch.rand((), generator=g, dtype=torch.float64)) < float(p[b, i, d[b, i]]) / qd

    def nxt(b, n, d, q, p, g):
        if n == d.shape[1]:
            return int(sample(p[b, n], g))
        qrow = torch.zeros_like(p[b, n])
        if q is None:
            qrow[d[b, n]] = 1.0
        else:
            qrow = q[b, n]
        r = (p[b, n] - qrow).abs()
        return int(sample(r / r.sum(), g))

    return _one_row(draft_tokens, q_probs, p_probs, generator, accept, nxt)


def bonus_from_wrong_position(draft_tokens, q_probs, p_probs, generator) -> Verdict:
    """Correct except that the bonus token is drawn from the last draft's row instead of row k."""
    from quickdraft.verifiers.speculative import speculative_verify

    v = speculative_verify(draft_tokens, q_probs, p_probs, generator)
    k = draft_tokens.shape[1]
    for b in range(draft_tokens.shape[0]):
        if int(v.num_accepted[b]) == k and k > 0:
            v.next_tokens[b] = sample(p_probs[b, k - 1], generator)
    return v


def verify_tree_greedy(tree, p_rows: torch.Tensor) -> tuple[list[int], int]:
    """The greedy tree rule from whole rows: (accepted node path, next token) by argmax of p_rows
    ((n+1, V) target rows, probs or logits), through the library's `follow_greedy`."""
    from quickdraft.verifiers.tree import follow_greedy

    return follow_greedy(tree, p_rows.argmax(-1).tolist())
