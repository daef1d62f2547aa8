"""One options model: the same names, defaults and errors from every surface; one drafter grammar."""

import pytest

from quickdraft.bench.methods import QuickdraftMethod, parse_methods
from quickdraft.cli import _build_parser
from quickdraft.drafters.spec import DrafterSpec, parse_drafter_spec
from quickdraft.errors import QuickdraftError
from quickdraft.server import ServeConfig
from quickdraft.settings.flags import given_options
from quickdraft.settings.options import OPTIONS, EngineConfig, options_from


def test_defaults_are_one_set():
    cfg = EngineConfig()
    assert (cfg.method, cfg.drafter, cfg.draft.num_draft_tokens, cfg.dtype) == ("sd", "auto", 4, "bfloat16")
    assert cfg.quantize == "auto" and cfg.drafter_stages == () and not cfg.quant.active  # resolved at load
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
    assert method.engine.config == options_from({"quantize": "none"}, want)  # auto resolved: a folder's own weights


def test_an_explicit_draft_length_asks_for_a_chain():
    """draft_tree auto sizes trees for drafters with a gain table; a draft length (or schedule) given
    without draft_tree means a chain, from every surface; draft_tree given keeps its value."""
    assert options_from({"draft_length": 3}).draft.tree == 0
    assert options_from({"schedule": "heuristic"}).draft.tree == 0  # an alias counts too
    assert options_from({"draft_length": 3, "draft_tree": "auto"}).draft.tree is None
    assert options_from({"draft_length": 3, "tree": 8}).draft.tree == 8
    assert options_from({"drafter": "head"}).draft.tree is None
    base = options_from({"draft_tree": 16})
    assert options_from({"draft_length": 3}, base).draft.tree == 16  # an earlier layer's explicit tree stays
    cli = _build_parser().parse_args(["generate", "x", "--drafter", "head", "--draft-length", "4"])
    assert options_from(given_options(cli)).draft.tree == 0
    assert ServeConfig.from_settings({"draft_length": 4}).engine.draft.tree == 0


def test_pearl_options_and_switches():
    cli = _build_parser().parse_args(["generate", "x", "--method", "pearl", "--gamma", "3", "--no-post-verify"])
    cfg = options_from(given_options(cli))
    assert cfg.pearl.gamma == 3 and cfg.pearl.post_verify is False and cfg.pearl.pre_verify is None
    assert options_from({"gamma": "auto", "parallel": "1"}).pearl == cfg.pearl.__class__(None, None, True, True)


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


# --- per-request options: rows of the same table, never part of an engine's config ---------------


def test_request_options_are_rows_of_the_one_table():
    from quickdraft.settings.options import ENGINE_OPTIONS, REQUEST_OPTIONS, RequestOptions, request_from, split_options

    assert set(REQUEST_OPTIONS) == {"temperature", "top_k", "top_p", "seed", "max_new_tokens", "stop"}
    assert not set(REQUEST_OPTIONS) & set(ENGINE_OPTIONS) and set(REQUEST_OPTIONS) | set(ENGINE_OPTIONS) == set(OPTIONS)
    assert OPTIONS["temperature"].default == 0.0 and OPTIONS["max_new_tokens"].default == 128
    got = request_from({"temperature": "0.5", "top_k": "4", "seed": "7", "stop": "END"})
    assert got.sampling.temperature == 0.5 and got.sampling.top_k == 4 and got.sampling.seed == 7
    assert got.stop == ("END",) and request_from({"stop": ["a", "b"]}).stop == ("a", "b")
    assert got.stop_config((2,)).eos_token_ids == (2,) and request_from({}) == RequestOptions()
    with pytest.raises(QuickdraftError, match="no option 'temperature'"):
        options_from({"temperature": 0.5})  # an engine is never keyed by a request setting
    with pytest.raises(QuickdraftError, match="top_p"):
        request_from({"top_p": 0})  # validated once, by SamplingConfig
    with pytest.raises(QuickdraftError, match="max_new_tokens"):
        request_from({"max_new_tokens": 0})
    with pytest.raises(QuickdraftError, match="no option 'draft_length'"):
        request_from({"draft_length": 3})
    engine, request, rest = split_options({"drafter": "ngram", "temperature": 1.0, "raw": True, "schedule": "fixed"})
    assert engine == {"drafter": "ngram", "schedule": "fixed"} and request == {"temperature": 1.0}
    assert rest == {"raw": True}


def test_every_cli_takes_its_flags_from_the_table():
    from quickdraft.settings.options import REQUEST_OPTIONS, request_from

    parser = _build_parser()
    args = parser.parse_args(["generate", "x", "--temperature", "0.7", "--stop", "a", "--stop", "b", "--seed", "3"])
    request = request_from(given_options(args, REQUEST_OPTIONS))
    assert (request.sampling.temperature, request.sampling.seed, request.stop) == (0.7, 3, ("a", "b"))
    with pytest.raises(SystemExit):  # a per-request option is no server setting
        parser.parse_args(["serve", "--temperature", "0.5"])
    for command in (["distill", "--data", "d", "--output", "o"], ["train-draft", "--data", "d", "--output", "o"]):
        args = parser.parse_args(command)
        assert (args.target, args.threads, args.device) == (None, None, "auto")  # the table's defaults
        with pytest.raises(SystemExit):
            parser.parse_args([*command, "--device", "tpu"])  # the table's choices
    export = parser.parse_args(["export", "--to", "vllm"])
    assert (export.drafter, export.draft_length) == (OPTIONS["drafter"].default, OPTIONS["draft_length"].default)
