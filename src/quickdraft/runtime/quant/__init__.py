"""Quantization in one room: the `--quantize` modes (`modes.py`), the one base class of every quantized linear
(`linear_base.py`) and its forms (`torch_linears.py`, `w8a8.py`, `w4a8.py`, `w6a8.py`, `q4k.py`; `rows.py`
joins a kind's linears), every GGUF block type's record and reader (`formats/`), a GGUF's linears
(`gguf_tensors.py`, `gguf_linears.py`) and `quantize_model` (`quantized.py`, floats through `float_source.py`)."""
