"""Weight formats in one room: every GGUF block type the runtime runs as stored, one record each
(`base.Format`: bytes a block, weights a block, the rows-as-stored -> kernel-form linear builder, the
kernel), registered here once. `runtime/formats/gguf_linears.py` builds a GGUF's linears from this registry;
`runtime/formats/quantized.py` asks it which files run as stored (`as_stored`) and refuses a type it lacks with
one line (`unsupported`), never requantizing it silently.

Adding a GGUF type is one file beside these (its block reader and its record) and one line below, with
a test that its weights equal `gguf.quants.dequantize`'s (tests/test_formats.py).
"""

from __future__ import annotations

from quickdraft.runtime.formats import iq4_nl, iq4_xs, q2_k, q3_k, q4_0, q4_k, q5_1, q5_k
from quickdraft.runtime.formats.base import Format

FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        q4_0.FORMAT,
        q4_0.Q4_1,
        q4_0.Q5_0,
        q4_0.Q8_0,
        q4_k.FORMAT,
        q4_k.Q6_K,
        q5_1.FORMAT,
        q2_k.FORMAT,
        q3_k.FORMAT,
        q5_k.FORMAT,
        iq4_nl.FORMAT,
        iq4_xs.FORMAT,
    )
}
FLOATS = ("F32", "F16", "BF16")  # left to the loaded model's own (converted) weights


def as_stored(types) -> bool:
    """Whether every block type in `types` runs as stored (a registered format or a float type)."""
    return all(t in FORMATS or t in FLOATS for t in types)


def unsupported(types) -> list[str]:
    """The block types in `types` that no format runs, sorted."""
    return sorted({t for t in types if t not in FORMATS and t not in FLOATS})


def describe() -> str:
    """The registered types, as an error message lists them."""
    return ", ".join(FORMATS)
