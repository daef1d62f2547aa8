"""What runs when the user leaves a choice open: the target's weights (`--quantize auto`) and the
drafter (`--drafter auto`), both the defaults. Each is chosen once the target is loaded, from what it is
(a GGUF-born model, a target with a known draft) and from this host's measured costs, and comes with a
one-line reason that the statistics, `--json` (`stats.ran.choice`) and the server's metrics carry.

    weights   a GGUF-born target (a named one, `--target FILE.gguf`) runs its own blocks (`w4a8`: Q4_K,
              Q6_K, Q8_0, ... as stored, times int8 activations: `runtime/quant/formats`), the model the user
              downloaded, as llama.cpp runs it; where quantized kernels cannot run (float64, `--runtime
              hf`, a GPU, a block type without a format) its bf16/float conversion runs and the reason
              says so. The embedded default too (its Q4_1 blocks): its suffix default ran faster on them
              than on the bf16 conversion its drafts were made on (docs/benchmarks.md, stop 66).
    drafter   a target with a known draft (the Qwen2.5-Coder 1.5B: its 0.5B sibling) drafts with it in
              its fast form (`model:NAME`: 4-bit blocks everywhere, a restricted head, a windowed prompt),
              mixed with suffix branches (`mix:`) where suffix drafts pay on this host's measured verify
              curve, alone otherwise; every other target drafts with suffix trees.

Every explicit option wins: `--quantize none`, `--drafter suffix`, ...
"""

from __future__ import annotations

import dataclasses
import importlib.util
from dataclasses import dataclass

from quickdraft.costs import cost_curve as curves
from quickdraft.drafters.model_free.suffix import TREE_GAIN, with_suffix_cache
from quickdraft.runtime import kernels
from quickdraft.runtime.choose import forces_reference, resolve_device
from quickdraft.runtime.quant import formats
from quickdraft.runtime.quant.gguf_tensors import gguf_types
from quickdraft.runtime.target import load_target
from quickdraft.weights.default import NAMED_TARGETS, fixed_weights
from quickdraft.weights.loading import LoadedModel

AUTO = "auto"
# target display name -> the named draft that ships for it (its package in the same extra)
KNOWN_DRAFTS = {"Qwen2.5-Coder-1.5B-Instruct": "qwen2.5-coder-0.5b"}
QUANT_DTYPES = ("bfloat16", "float32")  # what the quantized kernels take


@dataclass(frozen=True)
class Choice:
    """A default resolved: the value that runs and why (one line)."""

    value: str
    reason: str


def auto_weights(target: LoadedModel, dtype: str, runtime: str, device: str) -> Choice:
    """The target's weights when `--quantize` is left at auto (module docstring)."""
    if target.gguf is None:
        return Choice("none", "its own weights (a Hugging Face folder)")
    blocker = quantized_blocker(dtype, runtime, device)
    if blocker is not None:
        return Choice("none", f"the GGUF's conversion, not its own blocks: {blocker}")
    missing = formats.unsupported(gguf_types(target.gguf, target.model.config).values())
    if missing:
        return Choice("none", f"the GGUF's conversion: no kernel here runs its {', '.join(missing)} blocks as stored")
    return Choice("w4a8", "the GGUF's own blocks, as stored (--quantize none: its bf16 conversion)")


def quantized_blocker(dtype: str, runtime: str, device: str) -> str | None:
    """Why quantized kernels cannot run here (None: they can)."""
    if dtype not in QUANT_DTYPES:
        return f"{dtype} (the quantized kernels take bfloat16 or float32)"
    if forces_reference(runtime):
        return "--runtime hf (quantized linears need the native runtime)"
    if resolve_device(device) != "cpu":
        return "a GPU (the quantized kernels are CPU kernels)"
    if kernels.fused_ops() is None:
        return "no fused CPU kernels here (their build failed or is off: see `quickdraft prepare`)"
    return None


def known_draft(target: LoadedModel) -> str | None:
    """The named draft that ships for this target, if its package is installed."""
    name = KNOWN_DRAFTS.get(target.name)
    if name is None or importlib.util.find_spec(NAMED_TARGETS[name].package) is None:
        return None
    return name


def auto_drafter(target: LoadedModel, native_target, dtype: str, weights: str, runtime: str) -> Choice:
    """The drafter when `--drafter` is left at auto (module docstring). `native_target` is the loaded
    `Target` (its verify curve is measured here, once per host for a named target, as decoding would)."""
    draft = known_draft(target)
    if draft is None:
        why = "no known draft for this target" if target.name not in KNOWN_DRAFTS else "its draft is not installed"
        return Choice("suffix", f"suffix trees ({why})")
    fast = f"model:{draft}"
    if forces_reference(runtime) or not native_target.supports_trees:
        return Choice(fast, f"its draft {draft} alone (no verify curve on this runtime to price suffix branches)")
    curve = curves.cost_curve(native_target, target.name, dtype, fixed_weights(target.name), weights)
    budget = curves.best_budget(curve, TREE_GAIN)
    rows2 = curve.get(2) or min(curve.items(), key=lambda kv: abs(kv[0] - 2))[1]
    if budget > 0:
        return Choice(
            f"mix:{fast}",
            f"its draft {draft} (fast form) mixed with suffix branches: suffix drafts pay on this host's "
            f"verify curve (2 rows = {rows2:.2f} steps; best suffix budget {budget})",
        )
    return Choice(fast, f"its draft {draft} (fast form) alone: no suffix budget pays on this host's verify curve")


def resolve(config, target: LoadedModel, device: str, drafts: bool, build_drafter: bool, cache: int):
    """Every option left at auto resolved, once, for an engine: the weights for `target` on `device`, then
    (when the method `drafts`) the drafter, priced on the target built from those weights.

    Args:
        config: the EngineConfig as asked.
        build_drafter: whether the engine builds its drafter (False: one was given, auto stays unresolved).
        cache: tokens of earlier requests the suffix stages keep (the server's; 0: none).

    Returns:
        (the resolved config, the built target, {what: "VALUE: why"} for each default taken).
    """
    choices: dict[str, str] = {}
    config = resolve_weights(config, target, device, choices)
    built = load_target(target, config.runtime, config.quant)
    if drafts:
        config = resolve_drafter(config, target, built.target, build_drafter, cache, choices)
    return config, built, choices


def resolve_weights(config, target: LoadedModel, device: str, choices: dict[str, str]):
    """`config` (an EngineConfig) with `quantize` auto resolved for `target` (the reason in `choices`)."""
    if config.quantize != AUTO:
        return config
    dtype = str(target.model.dtype).removeprefix("torch.")  # as loaded (a caller's model may differ from config.dtype)
    choice = auto_weights(target, dtype, config.runtime, device)
    choices["weights"] = f"{choice.value}: {choice.reason}"
    return dataclasses.replace(config, quantize=choice.value)


def resolve_drafter(config, target: LoadedModel, native_target, build: bool, cache: int, choices: dict[str, str]):
    """`config` with `drafter` auto resolved for `target` and this host (when the engine builds its
    drafter: `build`; the reason in `choices`), and its suffix stages given `cache` tokens of earlier
    requests (the server's; 0: none)."""
    if config.drafter == AUTO and build:
        choice = auto_drafter(target, native_target, config.dtype, config.quantize, config.runtime)
        choices["drafter"] = f"{choice.value}: {choice.reason}"
        config = dataclasses.replace(config, drafter=choice.value)
    if cache and config.drafter_stages:
        stages = with_suffix_cache(config.drafter_stages, cache)
        config = config.with_stages(stages)
    return config
