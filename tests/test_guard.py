"""The draft guard (decoding/guard.py): drafting pauses while its measured rate is below plain
decoding's 1 token per step and resumes with a probe; outputs stay those of plain decoding."""

import pytest
import torch

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding import Autoregressive, Generators, collect
from quickdraft.decoding.guard import DraftGuard
from quickdraft.decoding.vanilla import SpeculativeDecoder
from quickdraft.drafters import PromptLookupDrafter
from quickdraft.drafters.tree import TreeShape
from quickdraft.runtime.caches.native_cache import NativeCachedModel

from conftest import tiny_llama


def test_a_losing_window_pauses_drafting_then_probes_again():
    guard = DraftGuard(lambda rows, nodes: 2.0, window=3, pause=2)
    assert [guard.update(4, 1) for _ in range(3)] == [False, False, True]  # 3 tokens for 6 steps: pause
    assert [guard.drafts() for _ in range(3)] == [False, False, True]  # two plain rounds, then a probe
    guard.reset()
    assert guard.drafts()


def test_each_losing_probe_doubles_the_pause_and_a_paying_window_resets_it():
    cost = {"steps": 2.0}
    guard = DraftGuard(lambda rows, nodes: cost["steps"], window=2, pause=3, max_pause=10)

    def plain_rounds() -> int:
        n = 0
        while not guard.drafts():
            n += 1
        return n

    pauses = []
    for _ in range(4):  # losing windows: 2 tokens for 4 steps
        assert [guard.update(4, 1) for _ in range(2)] == [False, True]
        pauses.append(plain_rounds())
    assert pauses == [3, 6, 10, 10]  # doubled, capped at max_pause
    cost["steps"] = 0.5  # now drafting pays: the verdict resets the doubling
    assert not any(guard.update(4, 1) for _ in range(3))
    cost["steps"] = 2.0  # the sliding window now holds one paying and one losing round: it loses
    assert guard.update(4, 1)
    assert plain_rounds() == 3  # the first pause again, not the doubled one


def test_a_carried_pause_ends_with_the_request_once_drafting_has_paid():
    """A carrying guard keeps its pause across requests while drafting never paid (a drafter that
    loses everywhere); once a window paid, a loss is the text's and the next request starts afresh."""
    cost = {"steps": 2.0}
    guard = DraftGuard(lambda rows, nodes: cost["steps"], window=2, pause=4, carries=True)
    assert [guard.update(4, 1) for _ in range(2)] == [False, True]  # never paid: the pause carries
    guard.reset()
    assert guard.paused() and guard.plain_left() == 4
    while not guard.drafts():
        pass
    cost["steps"] = 0.5
    assert not any(guard.update(4, 1) for _ in range(2))  # a paying window
    cost["steps"] = 2.0
    assert guard.update(4, 1) and guard.paused()  # the text turned: paused within this request
    guard.reset()
    assert not guard.paused() and guard.drafts()  # the next request starts afresh
    assert not guard.update(4, 1)  # with an empty window


def test_a_paying_window_keeps_drafting():
    guard = DraftGuard(lambda rows, nodes: 1.0 + 0.1 * nodes, window=2, pause=5)
    assert not any(guard.update(3, 2) for _ in range(10))  # 2 tokens for 1.3 steps
    assert guard.drafts()


def _run(decoder, prompt, n=40):
    return collect(decoder.rounds(prompt, SamplingConfig(), n, Generators.from_seed(0)), StopConfig(n))


def test_the_guard_keeps_plain_decodings_output_and_says_how_many_rounds_were_plain():
    target = tiny_llama(dtype=torch.float64)
    plain = Autoregressive(NativeCachedModel(target.model))
    losing = SpeculativeDecoder.tree(NativeCachedModel(target.model), PromptLookupDrafter(), TreeShape(4, width=1))
    losing.guard = DraftGuard(lambda rows, nodes: 50.0, window=2, pause=4)  # drafting never pays
    paying = SpeculativeDecoder.tree(NativeCachedModel(target.model), PromptLookupDrafter(), TreeShape(4, width=1))
    paying.guard = DraftGuard(lambda rows, nodes: 1.0, window=2, pause=4)  # a free forward always pays
    prompt = [5, 9, 13, 5, 9, 13, 5, 9]
    want = _run(plain, prompt).token_ids
    lost, paid = _run(losing, prompt), _run(paying, prompt)
    assert lost.token_ids == want == paid.token_ids
    assert lost.stats.extra.get("guard_pauses", 0) >= 1 and lost.stats.extra["guard_plain_rounds"] >= 4
    assert lost.stats.num_draft_tokens > 0  # it drafted (and probed) before and between the pauses
    assert "guard_plain_rounds" not in paid.stats.extra and paid.stats.num_draft_tokens > 0


def test_every_sd_engine_is_guarded_unless_no_guard():
    """Explicit chains and trees get the guard as auto trees do, priced by this host's curve (a chain
    pays one draft forward per token); `guard=False` (`--no-guard`) drafts every round."""
    from quickdraft.decoding.parts import round_cost
    from quickdraft.decoding.registry import METHODS
    from quickdraft.engine import Engine
    from quickdraft.settings.options import options_from

    target = tiny_llama(dtype=torch.float64)
    for named in ({"drafter": "ngram", "draft_length": 3}, {"drafter": "truncated:1@float64", "draft_tree": 4}):
        guarded = Engine(target, options_from({"method": "sd", "dtype": "float64", **named}))
        decoder = METHODS["sd"].build(guarded.parts, SamplingConfig())
        assert isinstance(decoder.guard, DraftGuard)
        plain = Engine(target, options_from({"method": "sd", "dtype": "float64", "guard": False, **named}))
        assert METHODS["sd"].build(plain.parts, SamplingConfig()).guard is None
    chain = round_cost(guarded.parts, chain=True)  # the truncated draft: a model drafter with a step cost
    assert chain(5, 4) > chain(5, 0) == round_cost(guarded.parts, chain=False)(5, 0)
    per_token = chain(2, 1) - chain(2, 0)  # one draft forward per chain token
    assert chain(5, 4) - chain(5, 0) == pytest.approx(4 * per_token)


def test_greedy_generations_carry_the_verdict_and_sampled_ones_start_fresh():
    """A greedy request's tokens do not depend on which rounds drafted, so greedy generations share
    one guard per engine (a pause goes on into the next request); a sampled one gets its own, so a
    seeded request does not depend on the requests before it."""
    from quickdraft.decoding.registry import METHODS
    from quickdraft.engine import Engine
    from quickdraft.settings.options import options_from

    target = tiny_llama(dtype=torch.float64)
    engine = Engine(target, options_from({"method": "sd", "dtype": "float64", "drafter": "ngram", "draft_length": 3}))
    first = METHODS["sd"].build(engine.parts, SamplingConfig())
    second = METHODS["sd"].build(engine.parts, SamplingConfig())
    assert first.guard is second.guard and first.guard.carries
    first.guard.update(3, 1)
    first.guard._plain_left = 5  # a pause in progress
    first.guard.reset()  # a new greedy generation: the pause goes on
    assert not second.guard.drafts()
    sampled = [METHODS["sd"].build(engine.parts, SamplingConfig(temperature=0.8)) for _ in range(2)]
    assert sampled[0].guard is not sampled[1].guard and not sampled[0].guard.carries
    assert sampled[0].guard is not first.guard and sampled[0].guard.drafts()
    guard = DraftGuard(lambda rows, nodes: 2.0, window=1, pause=3)
    guard.update(3, 1)
    guard.reset()
    assert guard.drafts()  # a guard that does not carry starts every generation drafting


def test_one_process_pearl_is_guarded_and_keeps_plain_decodings_output():
    """PEARL's halves run one after the other in one process, so its rounds are priced like a chain's
    and guarded; a guarded plain round is a pre round that drafts nothing (a plain step)."""
    from quickdraft.decoding.pearl import PearlDecoder
    from quickdraft.decoding.pearl_logic import PearlConfig
    from quickdraft.decoding.registry import METHODS
    from quickdraft.engine import Engine
    from quickdraft.settings.options import options_from
    from quickdraft.verifiers import GreedyMatch

    target = tiny_llama(dtype=torch.float64)
    prompt = [5, 9, 13, 5, 9, 13, 5, 9]
    want = _run(Autoregressive(NativeCachedModel(target.model)), prompt).token_ids
    pearl = PearlDecoder(NativeCachedModel(target.model), PromptLookupDrafter(), GreedyMatch(), PearlConfig(), 3)
    pearl.guard = DraftGuard(lambda rows, nodes: 50.0, window=2, pause=4)  # drafting never pays
    got = _run(pearl, prompt)
    assert got.token_ids == want
    assert got.stats.extra.get("guard_pauses", 0) >= 1 and got.stats.extra["guard_plain_rounds"] >= 4
    assert got.stats.num_draft_tokens > 0
    for named, guarded in (({}, True), ({"guard": False}, False)):  # the two-process runner has none
        engine = Engine(target, options_from({"method": "pearl", "drafter": "ngram", "dtype": "float64", **named}))
        assert isinstance(METHODS["pearl"].build(engine.parts, SamplingConfig()).guard, DraftGuard) is guarded


@pytest.mark.parametrize("pre_verify", [True, False])
def test_a_pause_keeps_pearls_rounds_plain_until_the_probe(pre_verify):
    """Every round of a pause is plain, with or without pre-verify: a plain round leaves PEARL at its
    first kind (not a post round over nothing pending, which drafted between the plain ones), and
    without pre-verify a paused draft-only round becomes a plain step; drafts pending at a verdict
    are verified without drafting more. A guard whose window is 2 drafts only in its windows: at
    most 2 drafted rounds a verdict (3 without pre-verify: its window opens with a draft-only round)."""
    from quickdraft.decoding.pearl import PearlDecoder
    from quickdraft.decoding.pearl_logic import PearlConfig
    from quickdraft.verifiers import GreedyMatch

    target = tiny_llama(dtype=torch.float64)
    prompt = [5, 9, 13, 5, 9, 13, 5, 9]
    want = _run(Autoregressive(NativeCachedModel(target.model)), prompt, 60).token_ids

    class Counted(PromptLookupDrafter):
        calls = while_paused = 0

        def propose(self, *args, **kwargs):
            tree = super().propose(*args, **kwargs)
            Counted.calls += bool(tree.tokens)  # rounds that drafted something
            Counted.while_paused += pearl.guard.paused()
            return tree

    config = PearlConfig(pre_verify=pre_verify)
    pearl = PearlDecoder(NativeCachedModel(target.model), Counted(), GreedyMatch(), config, 3)
    pearl.guard = DraftGuard(lambda rows, nodes: 50.0, window=2, pause=4)  # drafting never pays
    got = _run(pearl, prompt, 60)
    assert got.token_ids == want and got.stats.num_draft_tokens > 0
    pauses = got.stats.extra["guard_pauses"]
    assert pauses >= 2 and got.stats.extra["guard_plain_rounds"] >= 4 + 8
    assert Counted.calls <= (2 if pre_verify else 3) * (pauses + 1) and Counted.while_paused == 0


@pytest.mark.parametrize("pre_verify", [True, False])
def test_pearls_guard_is_charged_for_every_drafted_token(pre_verify):
    """Without pre-verify PEARL drafts in rounds with no verify (draft-only rounds); their tokens are
    committed later, so their cost joins the next verified round's: the guard is charged for every
    drafted token once, kept or thrown away."""
    from quickdraft.decoding.pearl import PearlDecoder
    from quickdraft.decoding.pearl_logic import PearlConfig
    from quickdraft.verifiers import GreedyMatch

    target = tiny_llama(dtype=torch.float64)
    charged = []

    def cost(rows: int, nodes: int) -> float:
        charged.append(nodes)
        return 0.0  # drafting always pays: every round drafts

    class Counted(PromptLookupDrafter):
        proposed = 0

        def propose(self, *args, **kwargs):
            tree = super().propose(*args, **kwargs)
            Counted.proposed += len(tree.tokens)
            return tree

    config = PearlConfig(pre_verify=pre_verify)
    pearl = PearlDecoder(NativeCachedModel(target.model), Counted(), GreedyMatch(), config, 3)
    pearl.guard = DraftGuard(cost, window=2)
    got = _run(pearl, [5, 9, 13, 5, 9, 13, 5, 9, 13, 5, 9])
    assert got.stats.num_draft_tokens > 0 and got.stats.extra["pearl_runs"] > 0
    assert sum(charged) == Counted.proposed  # drafted tokens, kept or thrown away


@pytest.mark.parametrize("draft_steps", [0.0, 6.0])
def test_the_batch_guard_prices_every_rows_drafting(draft_steps):
    """A batch's guard judges the whole round (its forward on the surface plus every row's drafting)
    against a plain round of the same rows: drafting that costs 6 steps a row pauses; free drafting
    on a flat surface cannot lose (a round commits at least a token a row at a plain round's cost)
    and never pauses; each row's tokens stay its plain decoding's."""
    from quickdraft.decoding.batch import BatchDecoder, run_batch
    from quickdraft.decoding.batch_plan import BatchPlan
    from quickdraft.runtime.caches.batched import BatchedTarget

    model = tiny_llama(vocab=48, layers=2, seed=5, dtype=torch.float64).model
    surface = {(b, w): 1.0 for b in (1, 2, 4) for w in (1, 5)}
    dec = BatchDecoder(BatchedTarget(NativeCachedModel(model), 2), PromptLookupDrafter(), BatchPlan(surface, fixed=4))
    dec.guard = DraftGuard(lambda rows, nodes: 0.0, window=4, pause=4, carries=True)
    dec.draft_cost = lambda nodes: draft_steps
    prompts = [[5, 6, 7, 8] * 4, [9, 10, 11] * 5, [12, 13] * 6]
    got = run_batch(dec, [(p, SamplingConfig(), StopConfig(40)) for p in prompts])
    for p, c in zip(prompts, got, strict=True):
        alone = Autoregressive(NativeCachedModel(model)).rounds(p, SamplingConfig(), 40, Generators.from_seed(0))
        assert c.tokens == collect(alone, StopConfig(40)).token_ids
    plain = sum(c.stats.extra.get("guard_plain_rounds", 0) for c in got)
    assert sum(c.stats.num_draft_tokens for c in got) > 0  # speculation happened before any verdict
    assert (plain > 0) == (draft_steps > 0)
