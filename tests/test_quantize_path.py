"""Following `quantize` from the Engine to the linears enters no module twice (issue #68's goal): on
every call stack under the quantizer, no quickdraft module appears in two separate runs (A -> B -> A),
for each weight form the embedded default's GGUF can take; with a control that plants such a stack.
The same for a `model:` drafter spec followed from the Engine to its kernels (issue #80's goal: no file
entered more than twice; measured, none is entered twice)."""

from __future__ import annotations

import sys

import pytest

from quickdraft import Engine, EngineConfig
from quickdraft.weights.loading import load_model

ROOT = "quickdraft.runtime.quant.quantized"  # every stack through it is on the quantize path


def modules_on(frame) -> list[str]:
    """The quickdraft modules on a call stack, outermost first, consecutive frames of one collapsed."""
    mods: list[str] = []
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("quickdraft") and (not mods or mods[-1] != name):
            mods.append(name)
        frame = frame.f_back
    return mods[::-1]


def reentries(stacks: list[list[str]], root: str = ROOT) -> set[str]:
    """The stacks (as text) through `root` that enter a module twice."""
    return {" -> ".join(s) for s in stacks if root in s and len(set(s)) < len(s)}


def engine_stacks(**config) -> list[list[str]]:
    """Every call's stack of quickdraft modules while an Engine over the embedded default is built."""
    target = load_model(None, "bfloat16")
    stacks: list[list[str]] = []

    def profile(frame, event, arg):
        if event == "call":
            stacks.append(modules_on(frame))

    sys.setprofile(profile)
    try:
        Engine(target, EngineConfig(**config))
    finally:
        sys.setprofile(None)
    return stacks


def quantize_stacks(quantize: str) -> list[list[str]]:
    return engine_stacks(method="ar", quantize=quantize)


SLOW = pytest.mark.slow  # requantized from floats under the profiler: 7-17 s each


@pytest.mark.parametrize(
    "quantize", ["auto", "w4a8", "gguf", "int4", pytest.param("w8a8", marks=SLOW), pytest.param("int8", marks=SLOW)]
)
def test_the_quantize_path_enters_no_module_twice(quantize):
    stacks = quantize_stacks(quantize)
    assert any(ROOT in s for s in stacks)  # the quantizer ran
    assert reentries(stacks) == set()


def test_a_module_entered_twice_is_found():  # negative control
    a, b = "quickdraft.runtime.quant.gguf_linears", "quickdraft.runtime.quant.formats"
    stacks = [["quickdraft.engine", ROOT, a, b, a], ["quickdraft.engine", ROOT, a, b]]
    assert reentries(stacks) == {f"quickdraft.engine -> {ROOT} -> {a} -> {b} -> {a}"}


MODEL_DRAFTER = "quickdraft.drafters.draft_models.model_drafter"


@pytest.mark.parametrize("drafter", ["model", "model;quant=int8", "quant:w4a8"])
def test_a_model_drafter_spec_enters_no_module_twice(drafter):
    target = str(load_model(None, "bfloat16").source)
    spec = drafter.replace("model", f"model:{target}", 1) if drafter.startswith("model") else drafter
    stacks = engine_stacks(method="sd", drafter=spec)
    assert any(MODEL_DRAFTER in s and ROOT in s for s in stacks)  # the drafter was built and quantized
    assert reentries(stacks, MODEL_DRAFTER) == set()
