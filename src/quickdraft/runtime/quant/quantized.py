"""Quantize a loaded model's linears for the native runtime: `--quantize int8|w8a8|w4a8|int4[:G]|gguf`.

Sources, best first: the model's own weights when it runs in float32/float64; else the checkpoint's
float32 tensors read from its folder (the embedded default's folder holds the GGUF's exact
dequantized values); a checkpoint stored in bf16 has nothing finer, and the report says so. `gguf`
reads the GGUF file the model came from (runtime/quant/gguf_tensors.py), and so does `w4a8` where there is
one (its Q4 blocks as they are). The embedding table, norms and
RoPE stay as loaded (a lookup, not a matmul).
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.host import release_free_memory
from quickdraft.runtime.quant import formats
from quickdraft.runtime.quant.float_source import float32_source as _float32_source
from quickdraft.runtime.quant.gguf_linears import gguf_linears
from quickdraft.runtime.quant.gguf_tensors import FOUR_BIT, gguf_types
from quickdraft.runtime.quant.modes import QuantSpec, check_dtype
from quickdraft.runtime.quant.rows import KeptRows, fused_slices
from quickdraft.runtime.quant.torch_linears import int4_linear, int8_linear
from quickdraft.runtime.quant.w4a8 import w4a8_linear
from quickdraft.runtime.quant.w8a8 import w8a8_linear
from quickdraft.weights.gguf_convert import open_gguf
from quickdraft.weights.loading import LoadedModel

LINEARS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)
# The LM head is the sensitive linear: teacher-forced greedy agreement with the bf16 target fell with an
# int4 head and not with an int8 one, at about the int4 head's step (docs/benchmarks.md, "Weight-only int8
# and int4"). So int4 keeps an int8 head, and the GGUF's Q8_0 head becomes int8.
GGUF_Q8 = "int8"
INT4_HEAD = "int8"
W4A8_HEAD = "w8a8"  # w4a8 keeps an 8-bit head as well: the GGUF's Q8_0 head on the same grid
HEADS = {"int4": QuantSpec(INT4_HEAD), "w4a8": QuantSpec(W4A8_HEAD)}  # a mode's LM head, where it differs


@dataclass
class Quantized:
    """Kernel-form linears by parameter name, and where they came from."""

    spec: QuantSpec
    linears: dict[str, object] = field(default_factory=dict)
    source: str = ""
    seconds: float = 0.0

    @property
    def nbytes(self) -> int:
        return sum(getattr(lin, "nbytes", 0) for lin in self.linears.values())

    def describe(self) -> str:
        return (
            f"{self.spec} weights ({len(self.linears)} linears, {self.nbytes / 2**20:.0f} MiB, from {self.source}, "
            f"built in {self.seconds:.1f} s)"
        )


FUSED = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj"))
_BUILT: dict[tuple, tuple] = {}  # (id of model, spec, dtype) -> (weakref to the model, weakref to Quantized)


def fuse_layers(linears: dict[str, object], config) -> dict[str, object]:
    """Each layer's q/k/v and gate/up as RowSlices of one linear over their rows (one copy that the
    runtime's fused q|k|v and gate|up calls take as it is: `rows.concat_rows`)."""
    for i in range(int(config.num_hidden_layers)):
        for group in FUSED:
            names = [f"model.layers.{i}.{name}.weight" for name in group]
            if all(n in linears for n in names):
                slices = fused_slices([linears[n] for n in names])
                if slices is not None:
                    linears.update(zip(names, slices, strict=True))
    return linears


def linear_names(config) -> list[str]:
    """Every quantizable linear's parameter name, LM head last."""
    layers = int(config.num_hidden_layers)
    return [f"model.layers.{i}.{lin}.weight" for i in range(layers) for lin in LINEARS] + ["lm_head.weight"]


def _gguf_w4a8(loaded: LoadedModel) -> tuple[dict[str, object], str]:
    """w4a8 linears from the GGUF the model came from, each block type as stored (`runtime/quant/formats`), and
    their source, where every linear's type has a format (`_own_blocks`)."""
    linears, counted = gguf_linears(loaded.gguf, loaded.model.config, q8="w8a8", q4="w4a8", fuse=FUSED)
    return linears, f"{loaded.gguf.name} ({_counts(counted)}; every block as stored)"


def _counts(types: dict[str, int]) -> str:
    """A GGUF's linears by block type, as the source line names them: "Q4_K x168, Q6_K x29"."""
    return ", ".join(f"{t} x{n}" for t, n in sorted(types.items()))


def _finer_than_4_bits(types: dict[str, str]) -> set[str]:
    """The linears a GGUF source stores finer than 4-bit blocks (Q5_0, Q6_K, Q8_0, floats): w4a8 keeps
    them 8-bit rather than lose what the file has. Gemma 3 270M's Q4_K_M file, all quantized to 4 bits:
    greedy agreement with bf16 0.854 (docs/benchmarks.md)."""
    return {name for name, kind in types.items() if kind not in FOUR_BIT}


def quantize_model(loaded: LoadedModel, spec: QuantSpec, dtype: torch.dtype | None = None) -> Quantized:
    """The kernel-form linears of `loaded` for `spec`, checked for `dtype` (default the model's); built
    once per model and spec while a holder keeps them (the bench's methods share one copy). Inference
    weights do not change; code that trains a model in place and quantizes it again must pass a copy.

    Raises QuickdraftError (one line) for a dtype the kernels lack, dims the groups do not divide, or
    `gguf` on a model that did not come from a GGUF file.
    """
    if spec.active:
        check_dtype(dtype or loaded.model.dtype, f"--quantize {spec}")
    kept = loaded.head_ids
    types = _w4a8_types(loaded, spec) if kept is not None else None  # read only where it decides the key
    # a head quantized from floats is built for a restricted head's rows alone: one build per head there
    floats = kept is not None and spec.active and spec.mode != "gguf" and not _own_blocks(loaded, spec, types)
    key = (id(loaded.model), str(spec), dtype, _ids_key(kept) if floats else None)
    model_ref, built_ref = _BUILT.get(key, (lambda: None, lambda: None))
    if model_ref() is loaded.model and built_ref() is not None:  # built already for this model: shared
        return built_ref()
    body = _built_body(key, loaded) if floats else None
    if body is not None:  # the same model and spec with another head: its layers shared, this head built
        built = _with_head(body, loaded, spec)
    else:
        built = _build(loaded, spec, _w4a8_types(loaded, spec) if types is None else types)
    open_gguf.cache_clear()
    release_free_memory()  # the blocks' float temporaries, the file's parsed metadata
    _BUILT[key] = (weakref.ref(loaded.model), weakref.ref(built))
    return built


def _built_body(key: tuple, loaded: LoadedModel) -> Quantized | None:
    """A live build of `loaded`'s model for the same spec and dtype as `key`, whatever its head."""
    for other, (model_ref, built_ref) in list(_BUILT.items()):
        if other[:3] == key[:3] and model_ref() is loaded.model and built_ref() is not None:
            return built_ref()
    return None


def _with_head(body: Quantized, loaded: LoadedModel, spec: QuantSpec) -> Quantized:
    """`body`'s layer linears (the same objects) with the LM head built for `loaded.head_ids` alone."""
    start = time.perf_counter()
    weight, _ = _float32_source(loaded)
    linears = dict(body.linears)
    try:
        linears["lm_head.weight"] = _head(weight, loaded, spec)
    except QuickdraftError as exc:
        raise QuickdraftError(f"--quantize {spec}: lm_head.weight: {exc}") from None
    return Quantized(spec, linears, body.source, time.perf_counter() - start)


def _head(weight, loaded: LoadedModel, spec: QuantSpec):
    """The LM head's kernel-form linear from floats in the mode's head form (`HEADS`), for a restricted
    head's kept rows alone (`KeptRows`). `weight`: `_float32_source`'s reader."""
    name, kept, form = "lm_head.weight", loaded.head_ids, HEADS.get(spec.mode, spec)
    if kept is None:
        return quantize_weight(weight(name), form)
    return KeptRows(quantize_weight(weight(name, kept), form), kept)


def _ids_key(ids: torch.Tensor | None) -> tuple | None:
    """A restricted head's ids as a cache key (None: the whole head)."""
    return None if ids is None else (int(ids.numel()), hash(ids.to(torch.long).numpy().tobytes()))


def _w4a8_types(loaded: LoadedModel, spec: QuantSpec) -> dict[str, str]:
    """{linear: GGUF block type} under w4a8 of a GGUF-born model, else empty (opens the file)."""
    return gguf_types(loaded.gguf, loaded.model.config) if spec.mode == "w4a8" and loaded.gguf is not None else {}


def _own_blocks(loaded: LoadedModel, spec: QuantSpec, types: dict[str, str]) -> bool:
    """Whether `spec` runs the GGUF's own blocks (w4a8 over linears of block types it packs as stored)."""
    return spec.mode == "w4a8" and not loaded.trained and bool(types) and formats.as_stored(types.values())


def _build(loaded: LoadedModel, spec: QuantSpec, types: dict[str, str]) -> Quantized:
    """`types`: `_w4a8_types` of `loaded` and `spec`."""
    start = time.perf_counter()
    config = loaded.model.config
    missing = formats.unsupported(types.values()) if not loaded.trained else []
    if missing:  # never requantized silently: the user's file is what runs, or nothing does
        raise QuickdraftError(
            f"--quantize w4a8: {loaded.gguf.name} holds GGUF type {', '.join(missing)}, which no kernel here runs "
            f"as stored (runs: {formats.describe()}); use --quantize none (its bf16 conversion) or int8"
        )
    own = _gguf_w4a8(loaded) if _own_blocks(loaded, spec, types) else None
    if own is not None:  # the GGUF's own blocks as stored
        linears, source = own
    elif spec.mode == "gguf":
        if loaded.gguf is None:
            raise QuickdraftError(
                f"--quantize gguf: {loaded.name} was not loaded from a GGUF file (the embedded default is); "
                "use --quantize int4 or int8"
            )
        if loaded.trained:
            raise QuickdraftError(f"--quantize gguf: {loaded.name} has trained layers its GGUF lacks; use w4a8")
        linears, types = gguf_linears(loaded.gguf, config, q8=GGUF_Q8)
        source = f"{loaded.gguf.name} ({_counts(types)}; Q8_0 as {GGUF_Q8})"
    elif spec.active:
        weight, source = _float32_source(loaded)
        head = HEADS.get(spec.mode, spec)
        finer = _finer_than_4_bits(types)
        if finer:
            source += f"; {len(finer)} linears stored finer than 4 bits in {loaded.gguf.name} as {W4A8_HEAD}"
        linears = {}
        for name in linear_names(config):
            try:
                if name == "lm_head.weight":  # a draft's head restricted to K ids: those rows alone
                    linears[name] = _head(weight, loaded, spec)
                else:
                    linears[name] = quantize_weight(weight(name), head if name in finer else spec)
            except QuickdraftError as exc:
                raise QuickdraftError(f"--quantize {spec}: {name}: {exc}") from None
    else:
        linears, source = {}, "no quantization"
    return Quantized(spec, fuse_layers(linears, config), source, time.perf_counter() - start)


def quantize_weight(weight: torch.Tensor, spec: QuantSpec):
    """The kernel-form linear of a float32 (out, in) weight for `spec` (int8, w8a8, w4a8 or int4)."""
    if spec.mode == "int8":
        return int8_linear(weight)
    if spec.mode == "w8a8":
        return w8a8_linear(weight)
    if spec.mode in ("w4a8", "w4a8-all"):
        return w4a8_linear(weight)
    if spec.mode == "int4":
        return int4_linear(weight, spec.group)
    raise ValueError(f"quantize_weight: no per-weight form for {spec.mode!r}")
