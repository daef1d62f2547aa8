"""One record per drafter kind (drafters/kinds.py): the records are complete, every surface reads
them, and a new kind is one record: registering it makes it parse, build, draft (losslessly, in
chains, chains of stages and cascades), refuse bad arguments and show in the help, with nothing else
changed."""

from __future__ import annotations

import pytest
import torch

from quickdraft import Engine, EngineConfig, QuickdraftError
from quickdraft.drafters import KINDS, Drafter, make_drafter
from quickdraft.drafters.base import draft_path
from quickdraft.drafters.kinds import DrafterKind, DrafterSpec, help_text, shipped_asset
from quickdraft.drafters.spec import int_arg, parse_drafter_spec
from quickdraft.settings.options import options_from

from conftest import tiny_text_model

DEFAULT = "SmolLM2-135M-Instruct"


@pytest.mark.parametrize("name", sorted(KINDS))
def test_every_record_is_complete(name):
    kind = KINDS[name]
    assert kind.name == name and kind.usage.startswith(name) and kind.summary and callable(kind.build)
    assert not kind.reads_target or kind.has_model, "reading the target's states means running a model"
    if kind.module is not None:  # a trainable module: train-draft makes it, training's eval runs it
        assert kind.trained_by == "train-draft" and kind.from_module is not None and kind.reads_target
        assert kind.module.kind == name
    if kind.asset:  # its shipped module or table is really shipped for the default target
        folder = shipped_asset(kind.asset, DEFAULT)
        assert folder is not None and folder.is_dir() and any(folder.iterdir()), folder
    assert shipped_asset(kind.asset or name, "another-model") is None


def test_the_surfaces_read_the_records():
    from quickdraft.drafters.spec import parse_drafter_spec
    from quickdraft.export import vllm_speculative_config
    from quickdraft.settings.options import OPTIONS
    from quickdraft.training.train_draft_cli import KINDS as TRAINABLE

    assert all(k.usage in OPTIONS["drafter"].help for k in KINDS.values())
    assert set(TRAINABLE) == {k.name for k in KINDS.values() if k.module is not None}
    exportable = {k.name for k in KINDS.values() if k.export is not None}
    assert exportable == {"ngram", "suffix", "model", "truncated"}
    with pytest.raises(QuickdraftError, match="no vLLM equivalent"):
        vllm_speculative_config(parse_drafter_spec("mag"), 4)
    with pytest.raises(QuickdraftError, match="tree"):  # mix needs a model kind that drafts trees
        parse_drafter_spec("mix:kangaroo")
    assert parse_drafter_spec("mix:quant")[0].arg == "quant"


def test_pearl_refuses_the_kinds_whose_record_reads_the_target():
    from quickdraft.config import SamplingConfig
    from quickdraft.decoding.parts import DecodeParts
    from quickdraft.decoding.registry import METHODS
    from quickdraft.runtime.caches.cached_model import CachedModel

    target = tiny_text_model(dtype=torch.float64)
    readers = sorted(k.name for k in KINDS.values() if k.reads_target)
    assert readers == ["head", "kangaroo", "specdec"]
    for name in readers:  # the chain's first stage reads nothing: the refusal comes from the record
        config = EngineConfig(method="pearl", drafter=f"ngram+{name}:/nowhere")
        parts = DecodeParts(CachedModel(target.model), make_drafter("ngram", target), config)
        with pytest.raises(QuickdraftError, match="PEARL") as refused:
            METHODS["pearl"].build(parts, SamplingConfig())
        assert name in str(refused.value)


# --- a new kind, declared as a user would, in one record ----------------------------------------


class RepeatDrafter(Drafter):
    """Drafts the last committed token N times (model-free, deterministic: q one-hot)."""

    def __init__(self, times: int, name: str) -> None:
        self.times, self.name = times, name

    def propose(self, context, request, sampling, generator):
        self.refuse_tree(request)
        return draft_path([context[-1]] * min(self.times, request.budget))


REPEAT = DrafterKind(
    name="repeat",
    usage="repeat[:N]",
    summary="the last token, N times",
    build=lambda spec, target, dtype, runtime: RepeatDrafter(spec.value, str(spec)),
    parse_arg=lambda arg: int_arg("repeat", arg, 2),
    has_model=False,
)


@pytest.fixture
def with_repeat(monkeypatch):
    monkeypatch.setitem(KINDS, "repeat", REPEAT)


def test_a_new_kind_is_one_record(with_repeat):
    assert parse_drafter_spec("repeat:3") == (DrafterSpec("repeat", "3"),)
    assert "repeat[:N]: the last token, N times" in help_text()
    with pytest.raises(QuickdraftError, match="repeat"):
        parse_drafter_spec("repeat:zero")
    with pytest.raises(QuickdraftError, match="no dtype"):
        parse_drafter_spec("repeat@float32")
    target = tiny_text_model(dtype=torch.float64)
    plain = Engine(target, EngineConfig(method="ar")).generate("aaaa bbbb", max_new_tokens=24)
    for spec in ("repeat:3", "ngram:2:2+repeat", "csd:repeat>mag"):
        out = Engine(target, options_from({"drafter": spec, "draft_tree": 0})).generate("aaaa bbbb", max_new_tokens=24)
        assert out.token_ids == plain.token_ids, spec
        assert out.stats.num_draft_tokens > 0, spec  # speculation happened
    sampled = Engine(target, options_from({"method": "pearl", "drafter": "repeat:2", "gamma": 2}))
    assert len(sampled.generate("abab", max_new_tokens=8, temperature=1.0, seed=1).token_ids) == 8


def test_a_stage_carries_its_kinds_typed_value():
    """A stage's options are parsed once, at the edge, by its kind's own parser (`parse_arg`): its
    builder reads the typed `value`, never the text (issue #68 item 5)."""
    (truncated,) = parse_drafter_spec("truncated:6;vocab=100")
    assert truncated.value[0] == 6 and truncated.value[1] is not None
    assert parse_drafter_spec("ngram:4:2")[0].value == (4, 2)
    assert parse_drafter_spec("suffix:none;cache=0;depth=5")[0].value == ("none", {"cache": 0, "depth": 5})
    assert parse_drafter_spec("quant:int4")[0].value[0].mode == "int4"
    (cascade,) = parse_drafter_spec("csd:ngram:2>mag;k=3,1")
    assert [level.kind for level in cascade.value.levels] == ["ngram", "mag"]
    assert cascade.value.levels[0].value == (2, 1)  # a level is a typed stage too
    assert DrafterSpec.of("ngram", "5") == DrafterSpec("ngram", "5") and DrafterSpec.of("ngram", "5").value == (5, 1)
    with pytest.raises(QuickdraftError, match="ngram"):
        DrafterSpec.of("ngram", "x")


def test_a_self_draft_head_restricted_to_k_ids(tmp_path):
    """`;vocab=K|PATH` on a self-draft: its head keeps the K most frequent ids of a ranking (q = 0
    elsewhere), greedy outputs stay plain decoding's; bad options and a target without a shipped
    ranking are refused by name."""
    from safetensors.torch import save_file

    from quickdraft.drafters.draft_models.vocab import RANKED

    from conftest import tiny_llama

    target = tiny_llama(vocab=48, layers=3, seed=5, dtype=torch.float64)
    ranked = torch.arange(target.vocab_size - 1, -1, -1, dtype=torch.int32)  # any order: a ranking
    save_file({"ranked": ranked}, str(tmp_path / RANKED))
    for spec in (f"truncated:2;vocab={tmp_path}", f"quant:int8;vocab={tmp_path / RANKED}"):
        sd = Engine(target, options_from({"drafter": spec, "draft_tree": 0, "draft_length": 3, "guard": False}))
        assert sd.drafter.model.head_ids.numel() == target.vocab_size
        ar = Engine(target, EngineConfig(method="ar"))
        for prompt in ([5, 6, 7, 5, 6, 7, 5], [9, 9, 9, 9]):
            a, b = ar.generate(prompt, max_new_tokens=16), sd.generate(prompt, max_new_tokens=16)
            assert b.token_ids == a.token_ids and b.stats.num_draft_tokens > 0
    for bad, why in (
        ("truncated:2;vocab=0", ">= 1"),
        ("quant:int8;k=3", "bad option .k=3. .options: ;vocab="),
        ("truncated:2;", "bad option"),
    ):
        with pytest.raises(QuickdraftError, match=why):
            parse_drafter_spec(bad)
    with pytest.raises(QuickdraftError, match="needs the target's tokenizer"):  # none ships, none to rank by
        Engine(target, options_from({"drafter": "truncated:2;vocab=8"}))
    few = Engine(target, options_from({"drafter": f"truncated:2;vocab={tmp_path}"}))
    assert few.drafter.model.head_ids.tolist() == sorted(ranked.tolist())
