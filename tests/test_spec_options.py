"""The one parser of a spec's ;key=value options (`spec_options.py`, issue #68 item 5): values come back
converted per kind, and every kind's bad option is one line naming the spec and its options."""

from __future__ import annotations

import pytest

from quickdraft.drafters.combined.cascade import parse_cascade
from quickdraft.drafters.draft_models.model_drafter import parse_model
from quickdraft.drafters.model_free.suffix import parse_suffix
from quickdraft.errors import QuickdraftError
from quickdraft.spec_options import ALL, count, int_or_all, number_at_least, parse_options, positive, take_options


def test_values_come_back_converted():
    options = {"n": positive, "c": count, "w": int_or_all, "l": number_at_least(1)}
    assert parse_options("x", "main;n=3;c=0;w=all;l=1.5", options) == ("main", {"n": 3, "c": 0, "w": ALL, "l": 1.5})
    assert parse_options("x", ";n=2", options) == (None, {"n": 2})
    assert parse_options("x", None, options) == (None, {})
    assert parse_options("x", "only", options) == ("only", {})


@pytest.mark.parametrize("arg", ["m;n=0", "m;n=a", "m;zz=1", "m;n=1;n=2", "m;n=", "m;n", "m;l=0.5"])
def test_a_bad_option_is_one_line_naming_the_spec(arg):
    options = {"n": positive, "l": number_at_least(1)}
    with pytest.raises(QuickdraftError, match="^drafter 'x': ") as info:
        parse_options("drafter 'x'", arg, options)
    assert "\n" not in str(info.value)


def test_a_spec_holding_other_specs_keeps_their_options():
    assert take_options("model:a;vocab=8>mag;k=2,4/4;l=2", ("k", "l")) == ("model:a;vocab=8>mag", ["k=2,4/4", "l=2"])


def test_each_kind_parses_through_it():
    assert parse_suffix("none;cache=0;depth=4") == ("none", {"cache": 0, "depth": 4})
    assert parse_cascade("ngram>mag;k=2,4/4;l=2").lenience == 2.0
    path, form = parse_model("x.gguf;vocab=64;window=all")
    assert path == "x.gguf" and form.vocab == "64" and form.window is None
    for bad in ("suffix", "none;depth=0"), ("csd", "ngram>mag;l=0.5"), ("model", "x;vocab=0"):
        parse = {"suffix": parse_suffix, "csd": parse_cascade, "model": parse_model}[bad[0]]
        with pytest.raises(QuickdraftError, match=f"drafter '{bad[0]}:"):
            parse(bad[1])
