"""DistillSpec's draft: a delta trained toward the target (`quickdraft distill`), rebuilt on its base.

`distilled[:PATH][;quant=MODE][;window=N]`: without PATH, the delta shipped for the embedded default
(a truncated copy of it); with PATH, a delta folder (`weights/delta.py`) on the base its JSON names: the
target's first N layers, or a draft model such as `qwen2.5-coder-0.5b` (`--init "model:NAME;train=N"`).
A model-born delta drafts as `model:` does: quantized on the native runtime (w4a8 by default for a
GGUF-born base: its own blocks where the delta did not retrain them, the trained layers quantized from
their trained values), reading the context's last N tokens with `;window=N`.
"""

from __future__ import annotations

from pathlib import Path

from quickdraft.drafters.draft_models.model_drafter import PMIN, ModelDrafter, native_drafter, own_dtype
from quickdraft.drafters.draft_models.vocab import split_options
from quickdraft.drafters.draft_models.window import parse_window
from quickdraft.drafters.kinds import DrafterKind, DrafterSpec
from quickdraft.weights.delta import delta_base, load_delta, shipped_delta_dir
from quickdraft.weights.loading import LoadedModel


def parse_distilled(arg: str | None):
    """`distilled[:PATH][;quant=MODE][;window=N]` -> (PATH or None, QuantSpec or None, window or None)."""
    from quickdraft.runtime.quant.modes import parse_quantize

    path, options = split_options("distilled", arg, ("quant", "window"))
    quant = options.get("quant")
    window = parse_window(options.get("window"), f"drafter 'distilled:{arg}'")
    return path, None if quant is None else parse_quantize(quant), window


def _build(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> ModelDrafter:
    path, quant, window = spec.value
    folder = shipped_delta_dir(target) if path is None else Path(path).expanduser()
    draft = load_delta(target, folder, own_dtype(dtype, target))  # a truncated copy (no GGUF): unquantized
    drafter = native_drafter(draft, target, str(spec), runtime, quant, window)
    if delta_base(folder).startswith("model:"):  # a draft model's delta drafts as `model:` does
        drafter.pmin = PMIN
    return drafter


KIND = DrafterKind(
    name="distilled",
    usage="distilled[:PATH][;quant=MODE][;window=N]",
    summary="a DistillSpec delta (without PATH the one shipped for the default target; a delta for a draft "
    "model, e.g. the 0.5B toward the Qwen 1.5B, drafts on its fast path)",
    build=_build,
    parse_arg=parse_distilled,
    drafts_trees=True,
    can_review=True,
    hf_model=True,
    trained_by="distill",
    asset="distilled",
)
