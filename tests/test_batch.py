"""Continuous batching (issue #28): the batch cache against the single cache (oracle), the batched
forward's logits against one sequence's (float64), every row's greedy output equal to the same
request alone whatever the other rows do (joining late, chunked prefill, leaving, cancelled, EOS,
stop strings, one-token budgets), the target's law per row at T = 1 with a negative control that
must fail, the plan from a cost surface, and the Engine's list path."""

from __future__ import annotations

import itertools

import pytest
import torch

from quickdraft import Engine, EngineConfig
from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.costs.batch_costs import fit_max_batch, measure_batch_costs, plan_budgets
from quickdraft.decoding import round as round_mod  # the round loop verifies every row there
from quickdraft.decoding.autoregressive import Autoregressive
from quickdraft.decoding.batch import BatchDecoder, run_batch
from quickdraft.decoding.batch_plan import BatchPlan
from quickdraft.decoding.collect import collect
from quickdraft.decoding.common import Generators
from quickdraft.drafters.draft_models.model_drafter import ModelDrafter
from quickdraft.drafters.model_free.ngram import PromptLookupDrafter
from quickdraft.drafters.model_free.suffix import SuffixDrafter
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.caches.batched import BatchedTarget, RowBlock
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.forward.graphs import StaticBatchForward
from quickdraft.verifiers.tree import TokenTree
from quickdraft.weights.loading import LoadedModel, truncated_copy

from conftest import tiny_llama, tiny_text_model
from oracles import CONTROL_SHARE, law_pvalue

GREEDY = SamplingConfig()


@pytest.fixture(scope="module")
def model():
    return tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float64).model


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 30, (n,), generator=g).tolist()
    base = [torch.randint(3, 48, (6,), generator=g).tolist() for _ in range(n)]
    return [(b * 8)[:n_] for b, n_ in zip(base, lengths, strict=True)]  # repetitive: drafts get accepted


def _alone(model, prompt, n, sampling=GREEDY, eos=()):
    ar = Autoregressive(NativeCachedModel(model))
    return collect(ar.rounds(prompt, sampling, n, Generators.from_seed(0)), StopConfig(n, eos_token_ids=eos)).token_ids


def test_batched_forward_equals_one_sequence(model):
    single, ref = NativeCachedModel(model), NativeCachedModel(model)
    bt = BatchedTarget(single, 4)
    prompts = [[5, 6, 7, 8, 9], [10, 11], list(range(12, 30))]
    for p in prompts:  # chunked prefill
        bt.prefill(p[:3], first=True)
        if len(p) > 3:
            bt.prefill(p[3:], first=False)
        bt.adopt()
    tree = TokenTree([25, 26, 27], [-1, -1, 1])
    blocks = [RowBlock([20, 21, 22]), RowBlock([23]), RowBlock([24, *tree.tokens], [0, *tree.depths], tree.mask())]
    out = bt.forward(blocks)
    for p, block, logits in zip(prompts, blocks, out, strict=True):
        ref.reset()
        ref.extend(p)
        pos = None if block.depths is None else [len(p) + d for d in block.depths]
        assert torch.allclose(ref.extend(block.tokens, positions=pos, tree_mask=block.mask), logits, atol=1e-10)
    bt.commit(0, [0, 1])
    bt.commit(1, [0])
    bt.commit(2, [0, 2])  # the tree's path root -> node 1 (token 26)
    bt.remove(1)  # the last row moves into row 1
    assert bt.lengths() == [7, len(prompts[2]) + 2]
    out = bt.forward([RowBlock([30, 31]), RowBlock([32])])
    for context, block, logits in ((prompts[0] + [20, 21], [30, 31], out[0]), (prompts[2] + [24, 26], [32], out[1])):
        ref.reset()
        ref.extend(context)
        assert torch.allclose(ref.extend(block), logits, atol=1e-10)


def test_batch_cache_oracle(model):
    """adopt copies the single cache, commit keeps chosen positions, remove moves the last row."""
    single = NativeCachedModel(model)
    bt = BatchedTarget(single, 3)
    for p in ([3, 4, 5], [6, 7, 8, 9]):
        bt.prefill(p, first=True)
        row = bt.adopt()
        assert torch.equal(bt.cache.k[:, row, :, : len(p)], single.cache.k[:, :, : len(p)])
    bt.forward([RowBlock([1, 2, 3]), RowBlock([4, 5])])
    before = bt.cache.k[:, 1, :, 4:6].clone()
    bt.commit(1, [1])  # keep the second new position as position 4
    assert torch.equal(bt.cache.k[:, 1, :, 4], before[:, :, 1]) and bt.lengths() == [3, 5]
    kept = bt.cache.k[:, 1, :, :5].clone()
    bt.remove(0)
    assert bt.lengths() == [5] and torch.equal(bt.cache.k[:, 0, :, :5], kept)
    with pytest.raises(ValueError, match="no row"):
        bt.remove(3)


@pytest.mark.parametrize(
    "drafter,plan",
    [
        (None, BatchPlan(None)),
        ("suffix", BatchPlan(None, fixed=6)),
        ("ngram", BatchPlan(None, fixed=3, trees=False)),
    ],
)
def test_every_row_equals_its_request_alone(model, drafter, plan):
    """Nine requests through three rows: late joins, chunked prefill (4 tokens a round), leaving."""
    prompts = _prompts(9)
    lengths = [1, 2, 17, 30, 5, 23, 30, 9, 12]
    made = {"suffix": lambda: SuffixDrafter(None), "ngram": PromptLookupDrafter, None: lambda: None}[drafter]()
    dec = BatchDecoder(BatchedTarget(NativeCachedModel(model), 3), made, plan, prefill_chunk=4)
    got = run_batch(dec, [(p, GREEDY, StopConfig(n)) for p, n in zip(prompts, lengths, strict=True)])
    for p, n, c in zip(prompts, lengths, got, strict=True):
        assert c.tokens == _alone(model, p, n) and len(c.tokens) == n
    accepted = sum(c.stats.num_accepted_draft_tokens for c in got)
    assert (accepted > 0) == (drafter is not None)  # speculation happened (and only with a drafter)
    assert dec.idle and dec.target.rows == 0


@pytest.mark.parametrize("form", ["tree", "chain"])
def test_model_drafters_batch_with_their_own_caches(model, form):
    """A draft model (the target's first layer) forked per row, each fork its own cache: every row
    equals its request alone, trees and chains, and the forks drafted."""
    prompts, lengths = _prompts(6, seed=4), [3, 19, 30, 8, 25, 14]
    draft = ModelDrafter(NativeCachedModel(truncated_copy(_loaded(model), 1, torch.float64).model), "truncated:1")
    plan = BatchPlan(None, fixed=4, trees=form == "tree")
    dec = BatchDecoder(BatchedTarget(NativeCachedModel(model), 3), draft, plan, prefill_chunk=5)
    got = run_batch(dec, [(p, GREEDY, StopConfig(n)) for p, n in zip(prompts, lengths, strict=True)])
    for p, n, c in zip(prompts, lengths, got, strict=True):
        assert c.tokens == _alone(model, p, n)
    assert sum(c.stats.num_accepted_draft_tokens for c in got) > 0  # speculation happened
    assert draft.model.length == 0  # the configured drafter's own cache was never used


@pytest.mark.parametrize("spec", ["truncated:1", "quant:int8", "mag", "ngram+truncated:1", "mix:truncated:1"])
def test_every_kind_runs_in_the_batched_engine(spec):
    """Model-drafted and composed kinds batch (the server's path): a list of prompts gives each
    prompt's own output, as a batch."""
    engine = Engine(tiny_text_model(dtype=torch.float64), EngineConfig(drafter=spec))
    assert engine.batch_unsupported() is None and engine.batch_decoder(2).guard is not None  # guarded
    prompts = ["abcabcabcab", "hello hello hello", "the cat. the cat."]
    alone = [engine.generate(p, max_new_tokens=20) for p in prompts]
    together = engine.generate(prompts, max_new_tokens=20)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert all(r.stats.extra.get("batch_rows") for r in together)  # they ran as a batch
    assert sum(r.stats.num_draft_tokens for r in together) > 0


def _loaded(model):
    return LoadedModel(model, None, "tiny")


def test_cancel_and_eos_do_not_change_the_others(model):
    prompts = _prompts(4, seed=1)
    eos_token = _alone(model, prompts[2], 12)[5]  # row 2 ends at its sixth token
    dec = BatchDecoder(BatchedTarget(NativeCachedModel(model), 4), SuffixDrafter(None), BatchPlan(None, fixed=4))
    for i, p in enumerate(prompts):
        dec.submit(i, p, GREEDY, StopConfig(12, eos_token_ids=(eos_token,) if i == 2 else ()))
    done = {}
    while not dec.idle:
        for u in dec.step():
            done[u.key] = u.collector
        if dec.rounds == 2:
            assert dec.cancel(1) and not dec.cancel(99)
    assert 1 not in done or not done[1].done
    for i in (0, 3):
        assert done[i].tokens == _alone(model, prompts[i], 12)
    assert done[2].tokens == _alone(model, prompts[2], 12, eos=(eos_token,)) and done[2].finish_reason == "stop"


@pytest.mark.parametrize("drafter", ["suffix", "model"])
def test_rows_have_the_target_law_at_t1(model, monkeypatch, drafter):
    """(x1, x2, x3) of many sampled rows, joining and leaving a 6-row batch, against the exact law
    of the model, drafted by the suffix drafter or by a sampling draft model (its trees carry q);
    a verifier that accepts every draft must fail the same test (on N // CONTROL_SHARE rows: oracles)."""
    tiny = tiny_llama(vocab=4, layers=1, seed=2, dtype=torch.float64, init=0.5).model
    other = tiny_llama(vocab=4, layers=1, seed=7, dtype=torch.float64, init=0.5).model
    prompt, n = [1, 2, 1, 2, 1], 1500
    law = {}
    with torch.inference_mode():
        for seq in itertools.product(range(4), repeat=3):
            ids = torch.tensor([prompt + list(seq)])
            probs = torch.softmax(tiny(input_ids=ids).logits[0, len(prompt) - 1 : -1], -1)
            law[seq] = float(probs[0, seq[0]] * probs[1, seq[1]] * probs[2, seq[2]])

    def chi2_pvalue(n: int) -> tuple[float, int]:
        made = SuffixDrafter(None) if drafter == "suffix" else ModelDrafter(NativeCachedModel(other))
        dec = BatchDecoder(BatchedTarget(NativeCachedModel(tiny), 6), made, BatchPlan(None, fixed=2))
        jobs = [(prompt, SamplingConfig(temperature=1.0, seed=i), StopConfig(3)) for i in range(n)]
        got = run_batch(dec, jobs)
        counts = {seq: 0 for seq in law}
        for c in got:
            counts[tuple(c.tokens)] += 1
        return law_pvalue(counts, law, n)[0], sum(c.stats.num_accepted_draft_tokens for c in got)

    pvalue, accepted = chi2_pvalue(n)
    assert pvalue > 1e-4 and accepted > 0  # speculation happened

    def accept_everything(tree, p_rows, generator):
        path = tree.path_to(len(tree) - 1) if len(tree) else []
        return path, int(torch.multinomial(p_rows[len(path)], 1, generator=generator))

    def follow_everything(tree, best):  # the same break in the rule for drafts without q rows
        path = tree.path_to(len(tree) - 1) if len(tree) else []
        return path, best[path[-1] + 1 if path else 0]

    monkeypatch.setattr(round_mod, "verify_tree_sampling", accept_everything)
    monkeypatch.setattr(round_mod, "follow_greedy", follow_everything)
    assert chi2_pvalue(n // CONTROL_SHARE)[0] < 1e-6


def test_plan_reads_the_surface():
    # measured on the 2-core AVX-512-BF16 host of this round (costs/batch_costs.py)
    rows = {1: [1.0, 1.07, 1.16, 1.45, 2.03], 4: [1.13, 1.49, 2.39, 3.62, 5.57], 16: [2.3, 3.53, 6.89, 11.0, 19.68]}
    surface = {(b, w): v for b, vs in rows.items() for w, v in zip((1, 2, 5, 9, 17), vs, strict=True)}
    gain = {1: 1.5, 4: 2.07, 8: 2.3, 16: 2.47}
    assert plan_budgets(surface, gain) == {1: 4, 4: 1, 16: 0}  # speculation shrinks, then stops
    assert plan_budgets(surface, None, fixed=3) == {1: 3, 4: 3, 16: 3}
    assert fit_max_batch(surface, plan_budgets(surface, gain), gain) == 16
    flat = {(b, w): float(b * w) for b in (1, 2, 4) for w in (1, 2, 5)}  # cost in proportion to rows
    assert fit_max_batch(flat, plan_budgets(flat, gain), gain) == 1  # batching buys nothing
    # the Qwen pair's w4a8 surface on a 2-core AVX2 host (stop 66), a draft model's fixed chains of 4 (no
    # gain table): priced as plain rows where nothing measures what drafting commits, 8 rows pay (4 clients
    # measured 1.8x one there); the old rule priced 4 drafted nodes as one token a row and fitted 1
    avx2 = {(1, 1): 1.0, (1, 5): 1.62, (2, 1): 1.03, (2, 5): 4.52, (4, 1): 1.73, (4, 5): 7.74}
    avx2 |= {(8, 1): 2.84, (8, 5): 11.23, (16, 1): 5.77, (16, 5): 23.72}
    assert fit_max_batch(avx2, {b: 4 for b in (1, 2, 4, 8, 16)}, None) == 8
    # a row's drafting priced beside the forward: the budget that paid at 4 rows by its forward alone
    # loses once each row's lookups cost a tenth of a step (control: free lookups keep it)
    assert plan_budgets(surface, gain, drafting=lambda k: 0.1) == {1: 4, 4: 0, 16: 0}
    assert plan_budgets(surface, gain, drafting=lambda k: 0.0) == plan_budgets(surface, gain)
    assert BatchPlan(surface, gain, draft_cost=lambda k: 0.1).budgets == {1: 4, 4: 0, 16: 0}
    plan = BatchPlan(surface, gain, replan=1)
    plan.observe([(4, 0)] * 200)  # drafts never accepted: speculation stops everywhere
    assert plan.budgets == {1: 0, 4: 0, 16: 0} and plan.request(1, 10) is None


def test_measured_surface_and_engine_list_path(model):
    bt = BatchedTarget(NativeCachedModel(model), 4)
    surface = measure_batch_costs(bt, batches=(1, 2, 4), widths=(1, 3), context=20, repeats=1)
    assert set(surface) == {(b, w) for b in (1, 2, 4) for w in (1, 3)} and surface[(1, 1)] == 1.0
    assert bt.rows == 0
    target = tiny_text_model(dtype=torch.float64)
    engine = Engine(target, EngineConfig(drafter="suffix:none"))
    prompts = ["abcabcabcab", "hello hello hello", "the cat. the cat."]
    alone = [engine.generate(p, max_new_tokens=20, stop=["q"]) for p in prompts]
    together = engine.generate(prompts, max_new_tokens=20, stop=["q"])
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [r.text for r in together] == [r.text for r in alone]
    assert all(r.stats.extra.get("batch_rows") for r in together)  # they ran as a batch


def test_engines_that_cannot_batch_say_why(tmp_path):
    target = tiny_llama(vocab=48, layers=2, seed=5)
    assert "decodes one sequence" in Engine(target, EngineConfig(method="pearl", drafter="ngram")).batch_unsupported()
    assert "native runtime" in Engine(target, EngineConfig(runtime="hf", drafter="ngram")).batch_unsupported()
    with pytest.raises(QuickdraftError, match="batched decoding is not available"):
        Engine(target, EngineConfig(verifier="lenient", drafter="ngram")).batch_decoder()


def test_static_forward_equals_the_dynamic_one(model):
    """The CUDA-graph path's static shapes (every slot, width buckets, attention over the whole
    capacity under an input mask), run eagerly on the CPU: equal logits, equal greedy outputs."""
    dynamic, static = BatchedTarget(NativeCachedModel(model), 4), BatchedTarget(NativeCachedModel(model), 4)
    static.static = StaticBatchForward(static, 128, graphs=False)
    for t in (dynamic, static):
        for p in ([5, 6, 7, 8, 9], [10, 11], list(range(12, 30))):
            t.prefill(p, first=True)
            t.adopt()
    tree = TokenTree([25, 26, 27], [-1, -1, 1])
    blocks = [RowBlock([20, 21, 22]), RowBlock([23]), RowBlock([24, *tree.tokens], [0, *tree.depths], tree.mask())]
    for x, y in zip(dynamic.forward(blocks), static.forward(blocks), strict=True):
        assert torch.allclose(x, y, atol=1e-12)
    assert sorted(static.static.inputs) == [(4, 256)]  # width 4 is a bucket; the span: the first bucket
    prompts, plan = _prompts(5, seed=3), BatchPlan(None, fixed=5)
    target = BatchedTarget(NativeCachedModel(model), 2)
    target.static = StaticBatchForward(target, 96, graphs=False)
    got = run_batch(BatchDecoder(target, SuffixDrafter(None), plan), [(p, GREEDY, StopConfig(20)) for p in prompts])
    assert [c.tokens for c in got] == [_alone(model, p, 20) for p in prompts]
    assert target.static.replays > 0
    with pytest.raises(ValueError, match="CUDA device"):
        StaticBatchForward(target, 96, graphs=True)


def test_static_forward_reads_a_span_bucket_and_a_lone_row_runs_its_head_inside(model):
    """Attention reads the smallest span bucket that holds the longest row (not the whole capacity):
    a row past 256 positions moves to the 512 bucket, with logits equal to the dynamic forward's; a
    batch of one runs its LM head inside the static forward (the graph), and both the chain's
    accepted prefix and a tree's path commit to what the dynamic target keeps."""
    dynamic, static = BatchedTarget(NativeCachedModel(model), 1), BatchedTarget(NativeCachedModel(model), 1)
    static.static = StaticBatchForward(static, 1024, graphs=False)
    assert static.static.capacity == 1024 and static.static.head_inside
    prompt = [(7 * i) % 45 + 3 for i in range(250)]
    for t in (dynamic, static):
        t.prefill(prompt, first=True)
        t.adopt()
    tree = TokenTree([25, 26, 27], [-1, -1, 1])
    steps = [RowBlock([4, 5, 6, 7]), RowBlock([8, *tree.tokens], [0, *tree.depths], tree.mask()), RowBlock([9, 10])]
    keeps = [[0, 1, 2, 3], [0, 2, 3], [0]]  # a chain's prefix, a tree's path, one token
    for blk, keep in zip(steps, keeps, strict=True):
        (x,), (y,) = dynamic.forward([blk]), static.forward([blk])
        assert torch.allclose(x, y, atol=1e-12)
        for t in (dynamic, static):
            t.commit(0, keep)
    assert sorted(static.static.inputs) == [(2, 512), (4, 256), (4, 512)]  # (width, span) buckets
    assert static.lengths() == dynamic.lengths() == [250 + 4 + 3 + 1]


def test_graphs_switch_runs_lone_requests_on_the_static_forward(flat_costs):
    """`graphs=on` (what CUDA gets by default): a lone request is a batch of one over the static
    forward (eager on a CPU), equal to the plain loop; a bad setting is refused by name."""
    target = tiny_text_model(dtype=torch.float64)
    plain = Engine(target, EngineConfig(drafter="suffix:none", graphs="off"))
    static = Engine(target, EngineConfig(drafter="suffix:none", graphs="on"))
    for prompt in ("abcabcabcab", "hello hello hello"):
        want = plain.generate(prompt, max_new_tokens=24)
        got = static.generate(prompt, max_new_tokens=24)
        assert got.token_ids == want.token_ids and got.text == want.text
        assert got.stats.num_accepted_draft_tokens > 0  # speculation happened
    assert static.parts.memo["batch_decoder", 1].target.static.replays > 0
    with pytest.raises(QuickdraftError, match="graphs"):
        EngineConfig(graphs="maybe")


@pytest.mark.parametrize("case", ["budget", "eos", "span"])
def test_a_lone_greedy_plain_row_feeds_its_steps_on_the_device(model, case):
    """Plain greedy decoding of a lone request on the static forward feeds each step's argmax to the
    next step on the device (`greedy_chain`: one graph a step on CUDA, eager here): equal to the
    plain loop in float64 at its budget, when EOS falls inside a chunk, and across the 256 -> 512
    span bucket (the next step's inputs moved on the device); the row's cache keeps what it took."""
    prompt = [(7 * i) % 45 + 3 for i in range(250)] if case == "span" else _prompts(1, seed=3)[0]
    n = 90 if case == "budget" else 40
    eos = (_alone(model, prompt, n)[12],) if case == "eos" else ()
    want = _alone(model, prompt, n, eos=eos)
    target = BatchedTarget(NativeCachedModel(model), 1)
    target.static = StaticBatchForward(target, 1024, graphs=False)
    dec = BatchDecoder(target, None, BatchPlan(None))
    dec.submit(0, prompt, GREEDY, StopConfig(n, eos_token_ids=eos))
    got, rows_after = None, []
    while not dec.idle:
        for u in dec.step():
            got = u.collector
        rows_after.append(list(target.cache.lengths))
    assert got.tokens == want and got.done
    assert target.static.chain_steps >= len(want) - 1 and target.static.replays == 0  # the chain ran, no rounds
    if case == "budget":  # the prefill's token, a chunk of CHAIN_TOKENS steps (a round boundary), the rest
        assert rows_after == [[len(prompt) + 32], [len(prompt) + 64], []] and target.static.chain_steps == n - 1
    if case == "span":
        assert sorted(target.static.inputs) == [(1, 256), (1, 512)]


def test_a_shared_prompt_prefix_is_prefilled_once(model):
    """A prompt that begins like the previous one (a chat template's system prompt) keeps that
    prefix in the prefill cache, and a prompt that begins like a finished row's sequence keeps its
    rows from the prefix store: fewer prompt tokens run, the same outputs. Control: without the store,
    the repeated prompt runs all it does not share with the one before it."""
    system = list(range(3, 23))
    prompts = [system + [30, 31, 32], system + [40, 41], system[:5] + [44], system + [30, 31, 32]]
    for store, last in ((1 << 24, 1), (0, 18)):
        target = BatchedTarget(NativeCachedModel(model), 2, store)
        ran = []
        prefill = target.prefill
        target.prefill = lambda tokens, first=False, prefill=prefill, ran=ran: (
            ran.append(len(tokens)) or prefill(tokens, first)
        )
        dec = BatchDecoder(target, SuffixDrafter(None), BatchPlan(None, fixed=3), prefill_chunk=8)
        got = run_batch(dec, [(p, GREEDY, StopConfig(10)) for p in prompts])
        assert [c.tokens for c in got] == [_alone(model, p, 10) for p in prompts]
        # the first prompt in chunks of 8 (a step never prefills more, idle or not), then what each prompt
        # does not share with the one before it, or (the last, the first again) with the first's kept rows
        assert sum(ran) == 23 + 2 + 1 + last and ran[:3] == [8, 8, 7] and max(ran) == 8
        assert got[3].stats.cached_prompt_tokens == len(prompts[3]) - last


def test_caches_grow_by_doubling_and_keep_their_contents():
    from quickdraft.runtime.caches.batch_cache import BatchKVCache
    from quickdraft.runtime.caches.static_cache import KVCache

    single = KVCache(2, 1, 3, torch.float64, "cpu", capacity=4, limit=20)
    single.ensure(3)
    single.k[:, :, :3] = torch.arange(18, dtype=torch.float64).view(2, 1, 3, 3)
    single.length = 3
    batch = BatchKVCache(2, 1, 3, torch.float64, "cpu", max_batch=2, capacity=2, limit=20)
    assert batch.adopt(single) == 0 and batch.capacity == 4  # grown: max(3, 2 * 2)
    single.ensure(9)
    assert single.capacity == 9 and torch.equal(single.k[:, :, :3], batch.k[:, 0, :, :3])
    batch.ensure(11)
    assert batch.capacity == 11 and torch.equal(batch.k[:, 0, :, :3], single.k[:, :, :3])
    with pytest.raises(ValueError, match="exceeds the model's context of 20"):
        batch.ensure(21)


def test_rows_of_very_different_lengths_attend_in_two_groups(model):
    """Short rows read only their own span when one row is much longer: the same logits."""
    from quickdraft.runtime.caches.batch_cache import length_groups

    assert length_groups([10, 10, 10]) is None  # nothing to save
    assert length_groups([100, 10, 12, 11]) == [([1, 2, 3], 12), ([0], 100)]
    bt, ref = BatchedTarget(NativeCachedModel(model), 4), NativeCachedModel(model)
    prompts = [[3 + i % 40 for i in range(150)], [5, 6], [7, 8, 9], list(range(10, 30))]
    for p in prompts:
        bt.prefill(p, first=True)
        bt.adopt()
    blocks = [RowBlock([1, 2]), RowBlock([3]), RowBlock([4, 5]), RowBlock([6])]
    out = bt.forward(blocks)
    assert bt.cache.groups == [([1, 2, 3], 22), ([0], 152)]
    for p, block, logits in zip(prompts, blocks, out, strict=True):
        ref.reset()
        ref.extend(p)
        assert torch.allclose(ref.extend(block.tokens), logits, atol=1e-10)


def test_the_batched_forward_runs_the_kernels_batch_invariantly_in_bf16():
    """On the CPU the batched forward runs the fused kernels (norms, linears and activations over
    every row at once, RoPE and attention row by row over its own cache): in bf16 every row's greedy
    output equals its request alone, drafts and late joins included."""
    from quickdraft.runtime import kernels

    if kernels.fused_ops() is None:
        pytest.skip("no fused kernels on this host")
    bf16 = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.bfloat16).model
    prompts, lengths = _prompts(7, seed=6), [9, 30, 4, 22, 30, 13, 17]
    dec = BatchDecoder(BatchedTarget(NativeCachedModel(bf16), 3), SuffixDrafter(None), BatchPlan(None, fixed=5))
    got = run_batch(dec, [(p, GREEDY, StopConfig(n)) for p, n in zip(prompts, lengths, strict=True)])
    assert [c.tokens for c in got] == [_alone(bf16, p, n) for p, n in zip(prompts, lengths, strict=True)]
    assert sum(c.stats.num_accepted_draft_tokens for c in got) > 0  # speculation happened


class _ClockedBatch:
    """A stand-in BatchedTarget whose forward of b rows of width w advances a fake clock by cost(b, w)."""

    def __init__(self, cost, clock: list[float]) -> None:
        self.cost, self.clock, self.rows, self.max_length, self.vocab_size = cost, clock, 0, 4096, 100
        self.cache = type("Cache", (), {"lengths": []})()

    def prefill(self, tokens, first=False):
        pass

    def adopt(self):
        self.rows += 1
        self.cache.lengths.append(200)

    def forward(self, blocks):
        self.clock[0] += self.cost(len(blocks), len(blocks[0].tokens))

    def remove(self, row):
        self.rows -= 1
        self.cache.lengths.pop()


def _measured_on(cost, monkeypatch) -> set[tuple[int, int]]:
    from quickdraft.costs import batch_costs

    clock = [0.0]
    monkeypatch.setattr(batch_costs.time, "perf_counter", lambda: clock[0])
    return set(measure_batch_costs(_ClockedBatch(cost, clock), repeats=1))


def test_wide_batches_are_measured_only_while_batching_still_pays(monkeypatch):
    """Sizes past 16 only while the size before made plain rows GROWTH times faster; wide batches at
    widths up to 5 only. Control: a host where batching is nearly free measures up to 64 rows."""
    compute_bound = _measured_on(lambda b, w: float(b * w), monkeypatch)  # every row costs a step
    assert max(b for b, _ in compute_bound) == 16
    cheap = _measured_on(lambda b, w: 1.0 + 0.01 * b * w, monkeypatch)
    assert max(b for b, _ in cheap) == 64 and {w for b, w in cheap if b >= 32} == {1, 2, 5}


def test_a_lone_row_takes_the_one_sequence_forward_with_the_batch_bits():
    """A batch of one row runs the one-sequence forward over its cache row (`forward_lone`): the same
    bits as the batched layers, for a chain and a tree. Control: a row whose mask hides a context key
    gives other bits (the comparison can fail)."""
    from quickdraft.runtime import kernels
    from quickdraft.runtime.caches.batched import block_inputs

    if kernels.fused_ops() is None:
        pytest.skip("no fused kernels on this host")
    bt = BatchedTarget(NativeCachedModel(tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.bfloat16).model), 2)
    bt.prefill(list(range(3, 40)), first=True)
    bt.adopt()
    net = bt.net
    tree = TokenTree([25, 26, 27], [-1, -1, 1])
    for block in (RowBlock([4, 5, 6]), RowBlock([8, *tree.tokens], [0, *tree.depths], tree.mask())):
        width = len(block.tokens)
        bt.cache.begin(width)
        ids, positions, mask, _ = block_inputs([block], torch.tensor(bt.cache.lengths), width, bt.cache.span)
        batched = net.forward_batch(bt.cache, ids, positions, mask)
        assert torch.equal(net.forward_lone(bt.cache, ids, positions, mask), batched)
        hidden = mask.clone()
        hidden[0, :, 5] = False
        assert not torch.equal(net.forward_lone(bt.cache, ids, positions, hidden), batched)
