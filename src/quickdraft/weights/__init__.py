"""Weights: loading and converting targets (GGUF, named targets), quantized formats, shipped draft weights."""
