"""The one parser of a spec's `;key=value` options (a drafter stage's `model:PATH;quant=w4a8;vocab=K`,
`suffix:PATH;cache=N`, `csd:LEVELS;k=2,4/4`, a student's `model:NAME;train=N`): each kind declares its
options once as {name: converter} and gets back its own argument and the values, converted (a bad key,
a repeated one, an empty value or one its converter refuses is one line naming the spec and the options).

Converters turn the text into the value a builder takes: `positive` (an int >= 1), `count` (an int >= 0),
`number_at_least(x)`, `int_or_all` (an int >= 1 or "all"), `text` (kept as written).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from quickdraft.errors import QuickdraftError

Converter = Callable[[str], object]
ALL = "all"


def _integer(value: str, least: int) -> int:
    if not value.isdigit() or int(value) < least:
        raise ValueError(f"an integer >= {least}")
    return int(value)


def positive(value: str) -> int:
    """An integer >= 1."""
    return _integer(value, 1)


def count(value: str) -> int:
    """An integer >= 0."""
    return _integer(value, 0)


def int_or_all(value: str) -> int | str:
    """An integer >= 1, or "all" (no limit)."""
    return ALL if value == ALL else _integer(value, 1)


def text(value: str) -> str:
    """The value as written (a mode or a path a builder checks itself)."""
    return value


def number_at_least(least: float) -> Converter:
    """A float >= `least`."""

    def number(value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise ValueError(f"a number >= {least:g}") from None
        if not x >= least:
            raise ValueError(f"a number >= {least:g}")
        return x

    return number


STUDENT_OPTIONS = {"train": positive}  # a model student's (and its delta's base): its last N layers train


def parse_options(spec: str, arg: str | None, options: Mapping[str, Converter]) -> tuple[str | None, dict[str, object]]:
    """(the argument before the first ';' or None when empty, {option: converted value}) of
    `ARG[;KEY=VALUE]...`. `spec` names the whole spec in errors ("drafter 'model:x;vocab=0'")."""
    if arg is None:
        return None, {}
    main, *items = arg.split(";")
    values: dict[str, object] = {}
    for item in items:
        key, eq, value = item.partition("=")
        if key not in options or not eq or not value or key in values:
            names = ", ".join(f";{name}=..." for name in options) or "none"
            raise QuickdraftError(f"{spec}: bad option {item!r} (options: {names}, each once)")
        try:
            values[key] = options[key](value)
        except ValueError as exc:
            raise QuickdraftError(f"{spec}: {key} must be {exc}, not {value!r}") from None
    return main or None, values


def take_options(arg: str, names: tuple[str, ...]) -> tuple[str, list[str]]:
    """(`arg` without its `;KEY=VALUE` items whose KEY is in `names`, those items): for a spec whose
    argument holds other specs' options (a cascade's levels keep their own ;vocab=, ;quant=)."""
    segments = arg.split(";")
    own = [s for s in segments[1:] if s.partition("=")[0] in names]
    return ";".join(s for s in segments if s not in own), own
