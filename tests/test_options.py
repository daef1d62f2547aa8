"""One options model: the same names, defaults and errors from every surface; one drafter grammar."""

import pytest

from quickdraft.bench.methods import QuickdraftMethod, parse_methods
from quickdraft.cli import _build_parser
from quickdraft.drafters.spec import DrafterSpec, parse_drafter_spec
from quickdraft.errors import QuickdraftError
from quickdraft.options import OPTIONS, EngineConfig, given_options, options_from
from quickdraft.server import ServeConfig


def test_defaults_are_one_set():
    cfg = EngineConfig()
    assert (cfg.method, cfg.drafter, cfg.draft.num_draft_tokens, cfg.dtype) == ("sd", "suffix", 4, "bfloat16")
    assert cfg.draft.tree is None  # auto: a host-sized tree for the suffix drafter, a chain for the others
    assert cfg.pearl.parallel is False  # the same in the CLI, the server and the bench
    assert options_from({}) == cfg
    assert ServeConfig.from_settings({}).engine == cfg
    assert options_from(given_options(_build_parser().parse_args(["generate", "x"]))) == cfg


def test_every_surface_parses_to_the_same_config(tiny_target):
    want = options_from({"method": "sd", "drafter": "ngram:2", "draft_length": 3, "draft_schedule": "heuristic"})
    cli = _build_parser().parse_args(
        ["generate", "x", "--drafter", "ngram:2", "--draft-length", "3", "--draft-schedule", "heuristic"]
    )
    assert options_from(given_options(cli)) == want
    yaml_like = {"drafter": "ngram:2", "draft_length": "3", "draft_schedule": "heuristic"}  # strings coerced
    assert ServeConfig.from_settings(yaml_like).engine == want
    (spec,) = parse_methods("sd:drafter=ngram:2,draft_length=3,schedule=heuristic")  # bench aliases
    method = QuickdraftMethod(spec, tiny_target, "bfloat16")
    assert method.engine.config == want


def test_pearl_options_and_switches():
    cli = _build_parser().parse_args(["generate", "x", "--method", "pearl", "--gamma", "3", "--no-post-verify"])
    cfg = options_from(given_options(cli))
    assert cfg.pearl.gamma == 3 and cfg.pearl.post_verify is False and cfg.pearl.pre_verify is True
    assert options_from({"gamma": "auto", "parallel": "1"}).pearl == cfg.pearl.__class__(None, True, True, True)


@pytest.mark.parametrize(
    "values, message",
    [
        ({"method": "medusa"}, "must be one of"),
        ({"draft_length": 0}, "draft length"),
        ({"draft_length": "x"}, "draft_length cannot be 'x'"),
        ({"draft_schedule": "sometimes"}, "must be one of"),
        ({"gamma": "0"}, "gamma"),
        ({"parallel": "maybe"}, "parallel cannot be"),
        ({"drafter": "bogus"}, "unknown drafter"),
        ({"dtype": "float16"}, "must be one of"),
        ({"threads": 0}, "threads"),
        ({"colour": "red"}, "no option 'colour'"),
    ],
)
def test_bad_options_are_refused_by_name(values, message):
    with pytest.raises(QuickdraftError, match=message):
        options_from(values)


def test_method_keys_are_the_options_the_method_reads():
    with pytest.raises(QuickdraftError, match="no option 'gamma'"):
        parse_methods("sd:gamma=3")
    assert set(OPTIONS) >= {"method", "drafter", "draft_length", "verifier", "gamma", "dtype", "threads"}


@pytest.mark.parametrize(
    "text, stages",
    [
        ("ngram", [DrafterSpec("ngram")]),
        ("ngram:3:2", [DrafterSpec("ngram", "3:2")]),
        ("model:/a/b", [DrafterSpec("model", "/a/b")]),
        ("truncated:6@bfloat16", [DrafterSpec("truncated", "6", "bfloat16")]),
        ("ngram:3:2+distilled", [DrafterSpec("ngram", "3:2"), DrafterSpec("distilled")]),
        ("distilled:/runs/x@float32", [DrafterSpec("distilled", "/runs/x", "float32")]),
    ],
)
def test_drafter_spec_grammar(text, stages):
    assert list(parse_drafter_spec(text)) == stages
    assert "+".join(map(str, parse_drafter_spec(text))) == text  # it prints back as written


@pytest.mark.parametrize(
    "text, message",
    [
        ("", "empty"),
        ("bogus", "unknown drafter"),
        ("model", "needs a path"),
        ("truncated", "integer"),
        ("truncated:x", "integer"),
        ("truncated:0", ">= 1"),
        ("ngram:1:3", "exceeds the longest"),
        ("ngram@bfloat16", "no dtype"),
        ("truncated:2@float16", "unknown dtype"),
        ("ngram+", "empty stage"),
    ],
)
def test_bad_drafter_specs(text, message):
    with pytest.raises(QuickdraftError, match=message):
        parse_drafter_spec(text)
