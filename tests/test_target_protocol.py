"""The `Target` protocol: three implementations (native, Hugging Face's, and a numpy forward written in
one test file), and the lossless suite through the library's decoders on the numpy one: logits equal
to Hugging Face's in float64, greedy speculation (chains and trees) equal to plain decoding, and
speculative sampling with the target's law (with negative controls that must fail)."""

import inspect

import pytest
import torch

from quickdraft.config import DraftConfig, SamplingConfig, StopConfig
from quickdraft.decoding import Autoregressive, Generators, SpeculativeDecoder, collect
from quickdraft.decoding.adaptive import make_draft_policy
from quickdraft.drafters import ModelDrafter, PromptLookupDrafter
from quickdraft.drafters.tree import TreeShape
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.runtime.caches.native_cache import NativeCachedModel
from quickdraft.runtime.target import Target, load_target
from quickdraft.verifiers import make_verifier
from quickdraft.verifiers.speculative import SpeculativeSampling

from conftest import noisy_copy, tiny_llama
from numpy_target import NumpyLlamaTarget
from oracles import Named, always_accept, naive_forward_logits, naive_greedy

PROMPTS = [[1, 2, 3], [7, 7, 7, 7], [5, 9, 13, 2, 40, 41, 5, 9], [33, 12, 33, 12, 33]]
GREEDY = SamplingConfig()


def _run(decoder, prompt, n=30, sampling=GREEDY, seed=0):
    return collect(decoder.rounds(prompt, sampling, n, Generators.from_seed(seed)), StopConfig(n))


def _members(cls) -> set[str]:
    return {n for n in dir(cls) if not n.startswith("_")}


@pytest.mark.parametrize("impl", [NativeCachedModel, CachedModel, NumpyLlamaTarget])
def test_every_backend_has_every_member_of_the_protocol(impl):
    wanted = _members(Target) | set(inspect.get_annotations(Target))
    missing = {n for n in wanted if n not in _members(impl) and n not in ("tokens", "num_forwards", "vocab_size")}
    assert not missing, f"{impl.__name__} lacks {sorted(missing)}"
    assert isinstance(impl.runtime, str) and isinstance(impl.supports_trees, bool)


def test_load_target_names_what_runs():
    loaded = tiny_llama(dtype=torch.float32)
    built = load_target(loaded, "auto")
    assert built.target.runtime == "native" and built.quantized is None
    assert built.info.to_dict() == {"target": "tiny-0", "weights": "float32", "runtime": "native", "device": "cpu"}
    assert load_target(loaded, "hf").target.runtime == "hf"


def test_numpy_logits_equal_hugging_face_float64():
    """To 1e-5: Hugging Face's norms and RoPE tables run in float32 even for a float64 model; the
    numpy forward's in float64. The cache oracle (cached rows == full recompute) is exact."""
    loaded = tiny_llama(dtype=torch.float64, layers=3)
    target = NumpyLlamaTarget(loaded.model)
    ids = [5, 9, 13, 2, 40, 41, 5, 9, 1]
    want = naive_forward_logits(loaded.model, ids)
    got = torch.cat([target.extend(ids[:4]), target.extend(ids[4:5]), target.extend(ids[5:])])
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    full = NumpyLlamaTarget(loaded.model).extend(ids[:3] + [7, 7])
    target.rollback(3)  # a rollback then a different continuation: equal to a full recompute
    assert torch.allclose(target.extend([7, 7]), full[3:], atol=1e-12, rtol=0)


@pytest.mark.parametrize("drafter", ["ngram", "noisy"])
@pytest.mark.parametrize("k", [1, 3])
def test_greedy_chains_on_the_numpy_target_equal_plain_decoding(drafter, k):
    loaded = tiny_llama(dtype=torch.float64)
    draft = PromptLookupDrafter() if drafter == "ngram" else ModelDrafter(CachedModel(noisy_copy(loaded, 0.3).model))
    policy = lambda: make_draft_policy(DraftConfig(k))  # noqa: E731
    spec = SpeculativeDecoder(NumpyLlamaTarget(loaded.model), draft, make_verifier(None, GREEDY), policy)
    plain = Autoregressive(NumpyLlamaTarget(loaded.model))
    accepted = 0
    for prompt in PROMPTS:
        got = _run(spec, prompt)
        assert got.token_ids == _run(plain, prompt).token_ids == naive_greedy(loaded.model, prompt, 30)
        accepted += got.stats.num_accepted_draft_tokens
    assert accepted > 0  # speculation happened and paid


@pytest.mark.parametrize("shape", [TreeShape(10, width=3), TreeShape(9, widths=(3, 2))])
def test_greedy_trees_on_the_numpy_target_equal_plain_decoding(shape):
    loaded = tiny_llama(dtype=torch.float64, layers=3, seed=2)
    drafter = ModelDrafter(NativeCachedModel(noisy_copy(loaded, 0.3).model))
    spec = SpeculativeDecoder(NumpyLlamaTarget(loaded.model), drafter, make_verifier(None, GREEDY), None, shape=shape)
    nodes = accepted = 0
    for prompt in PROMPTS:
        got = _run(spec, prompt)
        assert got.token_ids == naive_greedy(loaded.model, prompt, 30)
        nodes += got.stats.extra.get("tree_nodes", 0)
        accepted += got.stats.num_accepted_draft_tokens
    assert nodes > len(PROMPTS) * 10 and accepted > 0  # trees were drafted, verified and accepted from


def _law_pvalue(verifier, broken=None) -> tuple[float, int]:
    """The chi-square p-value of speculative sampling on the numpy target against its exact law
    (tests/test_real_distribution.py's test, its target swapped for the numpy one); `broken`: the
    broken rule a negative control runs, which sets its number of generations."""
    from test_real_distribution import N, control_n, law_models, pvalue

    target, draft = law_models()
    parts = (NumpyLlamaTarget(target.model), ModelDrafter(CachedModel(draft.model)))
    return pvalue(verifier, (target, draft), parts, N if broken is None else control_n(broken))


@pytest.mark.slow
def test_speculative_sampling_on_the_numpy_target_has_the_target_law():
    p, rejected = _law_pvalue(SpeculativeSampling())
    assert rejected > 0 and p > 1e-3


@pytest.mark.slow
def test_the_law_test_on_the_numpy_target_can_fail():
    assert _law_pvalue(Named(always_accept), always_accept)[0] < 1e-3


def test_statistics_say_what_ran_alone_in_a_batch_and_in_server_metrics():
    from quickdraft import Engine
    from quickdraft.server.protocol import spec_metrics
    from quickdraft.settings.options import options_from

    loaded = tiny_llama(dtype=torch.float32)
    engine = Engine(loaded, options_from({"drafter": "ngram", "draft_length": 2}))
    want = {"method": "sd", "drafter": "ngram", "target": "tiny-0", "weights": "float32", "runtime": "native"}
    alone = engine.generate_ids([1, 2, 3, 1, 2], GREEDY, StopConfig(8)).stats
    choice = "weights none: its own weights (a Hugging Face folder)"  # the one default left open (settings/defaults.py)
    assert alone.ran == {**want, "device": "cpu", "choice": choice} and alone.to_dict()["ran"] == alone.ran
    batch = engine.generate_batch([[1, 2, 3], [4, 5, 4, 5]], GREEDY, StopConfig(8))
    assert all(r.stats.ran == alone.ran for r in batch)
    assert spec_metrics(alone)["speculative_decoding"]["drafter"] == "ngram"
    plain = Engine(loaded, options_from({"method": "ar", "runtime": "hf"}))
    assert plain.generate_ids([1, 2], GREEDY, StopConfig(4)).stats.ran["runtime"] == "hf"
