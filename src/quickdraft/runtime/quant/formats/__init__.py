"""Every GGUF block type the runtime runs, one record each (`base.Format`: bytes a block, weights a block,
the rows-as-stored -> kernel-form linear builder, the kernel, and the block reader `--quantize gguf`'s aten
forms take), registered here once: the one place a block type is looked up. `runtime/quant/gguf_linears.py`
builds a GGUF's linears from this registry; `runtime/quant/quantized.py` asks it which files run as stored
(`as_stored`) and refuses a type it lacks with one line (`unsupported`), never requantizing it silently.

Adding a GGUF type is one file beside these (its block reader and its record) and one line below (or a
`register` call), with a test that its weights equal `gguf.quants.dequantize`'s (tests/test_formats.py;
tests/test_quant_room.py registers a toy one).
"""

from __future__ import annotations

from quickdraft.errors import QuickdraftError
from quickdraft.runtime.quant.formats import iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_k, q5_1, q5_k, q6_k
from quickdraft.runtime.quant.formats.base import Format

FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        q4_0.FORMAT,
        q4_0.Q4_1,
        q4_0.Q5_0,
        q4_0.Q8_0,
        q4_k.FORMAT,
        q6_k.FORMAT,
        q5_1.FORMAT,
        q2_k.FORMAT,
        q3_k.FORMAT,
        q5_k.FORMAT,
        iq4_nl.FORMAT,
        iq4_xs.FORMAT,
    )
}
FLOATS = ("F32", "F16", "BF16")  # left to the loaded model's own (converted) weights


def register(record: Format) -> Format:
    """Add a block type's record (refusing a name already taken); returns it."""
    if record.name in FORMATS or record.name in FLOATS:
        raise QuickdraftError(f"GGUF type {record.name} already has a record")
    FORMATS[record.name] = record
    return record


def as_stored(types) -> bool:
    """Whether every block type in `types` runs as stored (a registered format or a float type)."""
    return all(t in FORMATS or t in FLOATS for t in types)


def unsupported(types) -> list[str]:
    """The block types in `types` that no format runs, sorted."""
    return sorted({t for t in types if t not in FORMATS and t not in FLOATS})


def describe() -> str:
    """The registered types, as an error message lists them."""
    return ", ".join(FORMATS)
