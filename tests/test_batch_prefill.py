"""A batch's prefills are the bits of each prompt's own, whatever else the server runs (issue #79: every
greedy answer equal to its lone one under any load). A prompt is prefilled in pieces ending at multiples
of the chunk (`piece`), its attention is row-invariant within `invariant_prefill` (the kernel, where SDPA's
sums depend on the piece), and a prefix taken from another request is cut to what keeps the rest exact
(`reusable`). The controls run the old scheme (pieces cut by the step's budget, SDPA, any prefix) and
show the comparison fails."""

from __future__ import annotations

import contextlib

import pytest
import torch

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding import batch as batch_mod
from quickdraft.decoding.batch import BatchDecoder, piece, run_batch
from quickdraft.decoding.batch_plan import BatchPlan
from quickdraft.runtime import kernels
from quickdraft.runtime.caches import batched as batched_mod
from quickdraft.runtime.caches.batched import BatchedTarget
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.caches.prefix_store import reusable
from quickdraft.runtime.kernels import attention

from conftest import tiny_llama


def test_pieces_end_at_multiples_of_the_chunk():
    assert [piece(d, 300, 128) for d in (0, 100, 128, 256, 299)] == [128, 28, 128, 44, 1]


def test_what_a_prefill_may_take_from_another_request():
    assert reusable(200, 0, 128, 2048) == 200  # within the row-invariant context: all it shares
    assert reusable(3000, 5000, 128, 2048) == 2944  # beyond: whole pieces only
    assert reusable(3000, 2900, 128, 2048) == 2816  # ... that the other prompt prefilled itself
    assert reusable(3000, 100, 128, 2048) == 2048  # an answer's positions (decoded a row at a time): none
    assert reusable(300, 300, 128, 0) == 256  # no row-invariant attention: whole pieces from the start


def _prompts() -> list[list[int]]:
    """Seven prompts of 90-420 tokens, most sharing a long prefix with another (a system prompt, an
    earlier turn), so they take prefixes from each other and their pieces straddle the steps' budgets."""
    g = torch.Generator().manual_seed(3)
    base = torch.randint(3, 48, (420,), generator=g).tolist()
    cuts = [(300, 120), (200, 90), (300, 60), (0, 150), (350, 70), (90, 100), (260, 40)]
    return [base[:keep] + torch.randint(3, 48, (new,), generator=g).tolist() for keep, new in cuts]


def _kept_rows(decoder: BatchDecoder) -> dict[tuple[int, ...], torch.Tensor]:
    """{prompt: its keys as the finished row kept them} from the decoder's prefix store."""
    return {tuple(e.tokens): e.k for e in decoder.target.store.entries.values()}


def _run(model, prompts, max_batch):
    decoder = BatchDecoder(BatchedTarget(NativeCachedModel(model), max_batch), None, BatchPlan(None, fixed=0))
    out = run_batch(decoder, [(p, SamplingConfig(), StopConfig(6)) for p in prompts])
    if max_batch > 1:  # prefixes were taken from other requests (the prefill cache's and the store's)
        assert sum(c.stats.cached_prompt_tokens > 0 for c in out) >= 4 and decoder.target.store.hits >= 1
    return [c.tokens for c in out], _kept_rows(decoder)


def _compare(model, prompts):
    """(tokens equal, prompt keys equal) of each prompt batched with the others against it alone."""
    tokens, rows = _run(model, prompts, 3)
    alone = [_run(model, [p], 1) for p in prompts]
    same_tokens = [t == a[0][0] for t, a in zip(tokens, alone, strict=True)]
    same_rows = []
    for p, (_, kept) in zip(prompts, alone, strict=True):
        mine = next(k for key, k in rows.items() if list(key[: len(p)]) == p)
        theirs = next(iter(kept.values()))
        same_rows.append(torch.equal(mine[:, :, : len(p)], theirs[:, :, : len(p)]))
    return same_tokens, same_rows


@pytest.fixture
def bf16(monkeypatch):
    if kernels.fused_ops() is None:
        pytest.skip("no fused kernels on this host")
    monkeypatch.setattr(attention, "KERNEL_CONTEXT", 256)  # the SDPA side of the context within these prompts
    return tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.bfloat16).model


def test_a_batch_prefills_each_prompt_as_it_would_alone(bf16):
    same_tokens, same_rows = _compare(bf16, _prompts())
    assert all(same_rows) and all(same_tokens)


def test_the_old_scheme_changes_a_prompts_bits(bf16, monkeypatch):  # negative control
    monkeypatch.setattr(batch_mod, "invariant_prefill", contextlib.nullcontext)
    monkeypatch.setattr(batch_mod, "piece", lambda done, length, chunk: min(length - done, chunk // 2 + 37))
    monkeypatch.setattr(batched_mod, "reusable", lambda shared, *_: shared)
    _, same_rows = _compare(bf16, _prompts())
    assert not all(same_rows)
