"""What every quantized linear is (`QuantLinear`): a callable y = x W^T over (..., in) activations, with the
weight it computes with (`dequantized`), its output rows as a linear of their own (`rows`), its size and
the tensors it streams. The forms (`torch_linears.py`, `w8a8.py`, `w4a8.py`, `w6a8.py`, `q4k.py`) say
only how they pack and call; a GGUF block type's record (`formats/`) builds one from the file's rows.
"""

from __future__ import annotations

import torch

from quickdraft.errors import QuickdraftError
from quickdraft.runtime import kernels


class QuantLinear:
    """y = x W^T with W held quantized. A form sets `shape` (out, in) and either `packed` and `_kernel`
    (a fused kernel called as `kernel(x, packed, *extra)`: the default `__call__`) or its own `__call__`."""

    __slots__ = ()
    shape: tuple[int, int]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """(..., in) -> (..., out) in x's dtype (float32 or bf16)."""
        return kernels.on_rows(self._kernel, x, self.shape[0], *self.stored())

    @classmethod
    def of_packed(cls, shape: tuple[int, int], packed: torch.Tensor, kernel):
        """A linear of this form over bytes already in its kernel's layout (a GGUF's rows packed in one
        pass, or packed parts joined): `shape` (out, in), called as `kernel(x, packed)`."""
        self = cls.__new__(cls)
        self.shape, self.packed, self._kernel = shape, packed, kernel
        return self

    def stored(self) -> tuple[torch.Tensor, ...]:
        """The tensors the kernel reads on every call (what `nbytes` counts)."""
        return (self.packed,)

    def rows(self, ids: torch.Tensor) -> QuantLinear:
        """The same linear over output rows `ids` only (exact: rows are independent)."""
        raise NotImplementedError

    def dequantized(self) -> torch.Tensor:
        """(out, in) float32: the weight the kernel computes with."""
        raise NotImplementedError

    @property
    def out_features(self) -> int:
        return self.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.stored())


def gguf_shape(raw: torch.Tensor, kind: str, block_bytes: int, block_weights: int = 256) -> tuple[int, int]:
    """(out, in) of a GGUF tensor's rows as stored, (out, blocks x block_bytes) uint8, or a clear error."""
    if raw.dim() != 2 or raw.shape[1] % block_bytes:
        raise QuickdraftError(f"{kind} rows must be (out, super-blocks * {block_bytes}) bytes, not {tuple(raw.shape)}")
    return raw.shape[0], raw.shape[1] // block_bytes * block_weights


def fused_ops(what: str):
    """quickdraft's fused CPU kernels, or a clear error naming `what` needs them."""
    ops = kernels.fused_ops()
    if ops is None:
        raise QuickdraftError(f"{what} needs quickdraft's fused CPU kernels (a C++ compiler; see prepare)")
    return ops
