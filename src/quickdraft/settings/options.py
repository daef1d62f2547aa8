"""The options model: how a generation runs, with one set of defaults, one validator, one parser.

`EngineConfig` (`settings/engine_config.py`) holds every choice that builds an engine (method, drafter spec,
draft policy, verifier, PEARL window, target, dtype, threads); its parts (`DraftConfig`,
`PearlConfig`) validate themselves. `RequestOptions` holds what one request sets (sampling, stop
strings, the token budget): those rows are marked per-request and never key, rebuild or reload an
engine. `OPTIONS` is the one
table of flat option names as every surface spells them: CLI flags (`--draft-length`,
`--temperature`), serve YAML keys and flags, bench method keys (`sd:draft_length=3`), the server's
request fields and `quickdraft.generate()` / `Engine.generate()` keywords. `options_from` and
`request_from` are the one parser (strings are coerced by the option's type, unknown names refused
with the known ones listed, values validated once by the dataclasses); `flags.add_option_flags`
makes the CLI flags from the same table. Adding an option: a field on a config dataclass and one row here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from quickdraft.config import DTYPES, SCHEDULES
from quickdraft.decoding.registry import METHODS
from quickdraft.drafters.kinds import help_text
from quickdraft.errors import QuickdraftError
from quickdraft.runtime.choose import DEVICES, RUNTIMES
from quickdraft.settings.engine_config import EngineConfig, RequestOptions


def _bool(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise ValueError(text)


def int_or_auto(text: str) -> int | None:
    return None if text == "auto" else int(text)


@dataclass(frozen=True)
class Option:
    """One flat option: where it lives in EngineConfig, how a string becomes its value, its help."""

    name: str
    path: tuple[str, ...]
    parse: Callable[[str], object]
    help: str
    choices: tuple[str, ...] | None = None
    aliases: tuple[str, ...] = ()
    flag: str | None = None  # a CLI flag other than --name-with-dashes (boolean switches)
    per_request: bool = False  # a RequestOptions field, set per request (never keys an engine)
    many: bool = False  # a tuple of strings (a repeatable CLI flag)

    @property
    def default(self) -> object:
        value: object = RequestOptions() if self.per_request else EngineConfig()
        for part in self.path:
            value = getattr(value, part)
        return value


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("method", ("method",), str, "ar = plain, sd = speculative, pearl = PEARL", tuple(METHODS)),
        Option("drafter", ("drafter",), str, help_text()),
        Option(
            "draft_length",
            ("draft", "num_draft_tokens"),
            int,
            "draft tokens per round, gamma (default 4; a draft model's chains: up to 8, stopped where one more "
            "token is not expected to pay on this host's measured costs, unless a draft option is given)",
        ),
        Option(
            "draft_schedule",
            ("draft", "schedule"),
            str,
            "fixed | heuristic (+2/-1) | confidence (stop after a token the draft gives p < threshold) | cost "
            "(stop where one more token is not expected to pay on this host's verify curve and draft step)",
            SCHEDULES,
            aliases=("schedule",),
        ),
        Option(
            "confidence_threshold",
            ("draft", "confidence_threshold"),
            float,
            "for the confidence schedule",
            aliases=("threshold",),
        ),
        Option(
            "draft_tree",
            ("draft", "tree"),
            int_or_auto,
            "node budget of a draft tree: 0 = a chain, auto = sized from this host's measured verify costs "
            "(drafters with a measured gain table: suffix, a trained head; a chain for the others, or when "
            "draft_length is given)",
            aliases=("tree",),
        ),
        Option("tree_width", ("draft", "tree_width"), int, "dynamic tree: nodes expanded per depth, children each"),
        Option(
            "tree_shape", ("draft", "tree_shape"), str, "dynamic (EAGLE-2) or static children per depth, e.g. 3,2,1"
        ),
        Option(
            "guard",
            ("draft", "guard"),
            _bool,
            "never slower than plain decoding: plain rounds while drafting measurably loses on this host's "
            "costs, probing again later (--no-guard drafts every round and runs --parallel as asked)",
            flag="--no-guard",
        ),
        Option(
            "siblings",
            ("draft", "siblings"),
            _bool,
            "a greedy chain of the cost schedule also offers a draft model's second choice beside a position "
            "where it is expected to pay (one more verify row, no draft step; --no-siblings: plain chains)",
            flag="--no-siblings",
        ),
        Option(
            "verifier",
            ("verifier",),
            str,
            "greedy | speculative (lossless) | lenient[:L] (LOSSY, temperature > 0) | "
            "specdec[:beta=B,tau=T] (LOSSY when B > 1, temperature 0)",
        ),
        Option("gamma", ("pearl", "gamma"), int_or_auto, "PEARL window: an integer or auto (measured)"),
        Option(
            "pre_verify",
            ("pearl", "pre_verify"),
            _bool,
            "PEARL's pre-verify: on in two processes, off in one by default (there it spends a target forward on "
            "one token); the flag turns it off, pre_verify=1 on",
            flag="--no-pre-verify",
        ),
        Option(
            "post_verify",
            ("pearl", "post_verify"),
            _bool,
            "PEARL ablation: turn post-verify off",
            flag="--no-post-verify",
        ),
        Option(
            "parallel",
            ("pearl", "parallel"),
            _bool,
            "PEARL in two worker processes (1 core each at least); one process where it measures faster",
            flag="--parallel",
        ),
        Option("target", ("target",), str, "local HF model folder (default: embedded SmolLM2-135M-Instruct)"),
        Option("dtype", ("dtype",), str, "model dtype", DTYPES),
        Option("threads", ("threads",), int, "torch CPU threads (default: torch's choice)"),
        Option("runtime", ("runtime",), str, "native forward where supported (auto), or always native or hf", RUNTIMES),
        Option("device", ("device",), str, "auto | cpu | cuda", DEVICES),
        Option(
            "graphs", ("graphs",), str, "static shapes + CUDA graphs: auto (on CUDA) | on | off", ("auto", "on", "off")
        ),
        Option(
            "quantize",
            ("quantize",),
            str,
            "the target's weights: none | int8 | w8a8 | w4a8 | int4[:32|:64] | gguf (its own 4-bit blocks; the "
            "embedded default); weight-only but w8a8 and w4a8 (int8 activations too; w4a8 is the fastest step, on "
            "the GGUF's own blocks where there is one), native runtime; a quantized target is a different model",
        ),
        Option("temperature", ("sampling", "temperature"), float, "0 = greedy", per_request=True),
        Option("top_k", ("sampling", "top_k"), int, "keep the k most likely tokens (0 = off)", per_request=True),
        Option("top_p", ("sampling", "top_p"), float, "nucleus sampling mass (1 = off)", per_request=True),
        Option("seed", ("sampling", "seed"), int, "per-request seed (default: a fresh one)", per_request=True),
        Option("max_new_tokens", ("max_new_tokens",), int, "budget of generated tokens", per_request=True),
        Option("stop", ("stop",), str, "stop string (repeatable)", per_request=True, many=True),
    )
}
_ALIASES = {a: o.name for o in OPTIONS.values() for a in o.aliases}
ENGINE_OPTIONS = tuple(name for name, o in OPTIONS.items() if not o.per_request)
REQUEST_OPTIONS = tuple(name for name, o in OPTIONS.items() if o.per_request)
MODEL_OPTIONS = ("target", "dtype", "threads", "runtime", "device", "quantize")  # how the models load


def option_name(key: str, allowed: Iterable[str] | None = None, where: str = "") -> str:
    """The canonical name of `key` (aliases resolved); refuses names not in `allowed` (default: all)."""
    name = _ALIASES.get(key, key)
    known = list(OPTIONS) if allowed is None else list(allowed)
    if name not in known:
        raise QuickdraftError(f"{where}no option {key!r} (options: {', '.join(known) or 'none'})")
    return name


def _apply(config, values: Mapping[str, object], allowed: Iterable[str], where: str):
    """`config` (a dataclass) with flat option values applied along their paths; strings parsed by
    the option's type, choices checked, then the dataclasses validate (once, in __post_init__)."""
    groups: dict[str, dict[str, object]] = {}
    top: dict[str, object] = {}
    for key, value in values.items():
        opt = OPTIONS[option_name(key, allowed, where)]
        if opt.many:
            value = (value,) if isinstance(value, str) else tuple(value or ())  # type: ignore[arg-type]
        elif isinstance(value, str) and opt.parse is not str:
            try:
                value = opt.parse(value)
            except ValueError:
                raise QuickdraftError(f"{where}option {opt.name} cannot be {value!r}") from None
        if opt.choices is not None and value not in opt.choices:
            raise QuickdraftError(f"{where}{opt.name} must be one of {', '.join(opt.choices)}, got {value!r}")
        if len(opt.path) == 1:
            top[opt.path[0]] = value
        else:
            groups.setdefault(opt.path[0], {})[opt.path[1]] = value
    for group, changes in groups.items():
        top[group] = dataclasses.replace(getattr(config, group), **changes)
    return dataclasses.replace(config, **top)


def options_from(
    values: Mapping[str, object],
    base: EngineConfig | None = None,
    allowed: Iterable[str] | None = None,
    where: str = "",
) -> EngineConfig:
    """EngineConfig from flat engine options (CLI flags, YAML, bench keys, API keywords) over `base`.

    String values are parsed by the option's type ("3", "0.4", "1", "auto"); every value is then
    validated by the config dataclasses. `where` prefixes error messages (e.g. "sd:draft_length=x: ").
    Per-request options are refused here (`request_from` takes them).
    """
    allowed = tuple(ENGINE_OPTIONS if allowed is None else allowed)  # read twice
    config = _apply(base or EngineConfig(), values, allowed, where)
    named = {option_name(key, allowed, where) for key in values}
    if named & CHAIN_OPTIONS and "draft_tree" not in named and config.draft.tree is None:
        config = dataclasses.replace(config, draft=dataclasses.replace(config.draft, tree=0))
    return config


# a draft length or schedule given without `draft_tree` asks for a chain, not the auto tree
CHAIN_OPTIONS = frozenset({"draft_length", "draft_schedule", "confidence_threshold"})


def request_from(values: Mapping[str, object], base: RequestOptions | None = None, where: str = "") -> RequestOptions:
    """RequestOptions from flat per-request options (temperature, top_k, top_p, seed,
    max_new_tokens, stop) over `base`: the CLI's flags, `Engine.generate` keywords, the server's
    request fields and the bench's budget all pass here."""
    return _apply(base or RequestOptions(), values, REQUEST_OPTIONS, where)


def split_options(values: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object], dict[str, object]]:
    """(engine options, per-request options, the rest) of flat keyword values (aliases resolved)."""
    engine: dict[str, object] = {}
    request: dict[str, object] = {}
    rest: dict[str, object] = {}
    for key, value in values.items():
        name = _ALIASES.get(key, key)
        target = rest if name not in OPTIONS else request if OPTIONS[name].per_request else engine
        target[key] = value
    return engine, request, rest
