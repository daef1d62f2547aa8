"""A GGUF with a real model's shapes and random weights (issue #79 item 1): a 3B, 7B or 14B Qwen2.5's
architecture, dimensions and tokenizer (the 1.5B's: the family shares it), seeded random weights, then
llama.cpp's own quantizer to the asked type. A model's costs (step, verify, prefill, memory) depend on its
shapes, not its values; its greedy tokens are meaningless. Never tracked (it is GBs).

The F16 file is written one tensor at a time (header and tensor infos first, then each tensor's bytes as
it is made: no whole model in memory), with linears ~ N(0, 0.02) (a real model's init range: activations
stay finite through the layers), norms at 1, biases at 0; then `llama_model_quantize` (2 threads, the
`peers` extra) writes the quantized file and the F16 one is removed.

    python scripts/make_shaped_gguf.py --shape qwen2.5-7b --type Q4_K_M --out /tmp/qwen7b-shaped.gguf
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

# Qwen2.5's published configs: hidden, intermediate, layers, heads, kv heads, vocab rows, tied head
SHAPES = {
    "qwen2.5-3b": (2048, 11008, 36, 16, 2, 151936, True),
    "qwen2.5-7b": (3584, 18944, 28, 28, 4, 152064, False),
    "qwen2.5-14b": (5120, 13824, 48, 40, 8, 152064, False),
}
TYPES = {"Q4_K_M": 15, "Q6_K": 18, "Q8_0": 7, "Q4_0": 2}  # llama.cpp's LLAMA_FTYPE_MOSTLY_* values
SHAPE_KEYS = ("context_length", "embedding_length", "feed_forward_length", "block_count", "attention.head_count",
              "attention.head_count_kv")  # fmt: skip


def tensors(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, numpy shape (rows, cols)) of every tensor of `shape`, in the 1.5B file's order."""
    hidden, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    kv_dim = hidden // heads * kv
    out = [("token_embd.weight", (vocab, hidden))]
    for i in range(layers):
        b = f"blk.{i}."
        out += [(b + "attn_norm.weight", (hidden,)), (b + "ffn_norm.weight", (hidden,))]
        out += [(b + "attn_q.weight", (hidden, hidden)), (b + "attn_q.bias", (hidden,))]
        out += [(b + "attn_k.weight", (kv_dim, hidden)), (b + "attn_k.bias", (kv_dim,))]
        out += [(b + "attn_v.weight", (kv_dim, hidden)), (b + "attn_v.bias", (kv_dim,))]
        out += [(b + "attn_output.weight", (hidden, hidden))]
        out += [(b + "ffn_gate.weight", (inter, hidden)), (b + "ffn_up.weight", (inter, hidden))]
        out += [(b + "ffn_down.weight", (hidden, inter))]
    out.append(("output_norm.weight", (hidden,)))
    if not tied:
        out.append(("output.weight", (vocab, hidden)))
    return out


def values(name: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """A tensor's random values: norms 1, biases 0, every matrix N(0, 0.02); F16 matrices, F32 vectors."""
    if name.endswith("norm.weight"):
        return np.ones(shape, np.float32)
    if name.endswith(".bias"):
        return np.zeros(shape, np.float32)
    out = np.empty(shape, np.float16)
    for r in range(0, shape[0], 4096):  # in slabs: a float32 draw of the whole matrix is never held
        out[r : r + 4096] = (rng.standard_normal((min(4096, shape[0] - r), shape[1]), np.float32) * 0.02).astype(
            np.float16
        )
    return out


def source_gguf() -> Path:
    """The Qwen2.5-Coder 1.5B's GGUF (the `pair` extra): its metadata and tokenizer are copied."""
    from quickdraft.weights.default import named_gguf

    return named_gguf("qwen2.5-coder-1.5b")


def padded(key: str, values: list, vocab: int) -> list:
    """The tokenizer's per-token arrays padded to the embedding's rows (llama.cpp reads the vocabulary's
    size from the token list; Qwen2.5's 7B and 14B pad theirs to 152,064 rows): unused pad tokens."""
    pads = vocab - len(values)
    if pads <= 0 or key not in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.scores"):
        return values
    fill = {
        "tokenizer.ggml.tokens": [f"[PAD{len(values) + i}]" for i in range(pads)],
        "tokenizer.ggml.token_type": [5] * pads,
        "tokenizer.ggml.scores": [0.0] * pads,
    }[key]  # 5: unused
    return [*values, *fill]  # fmt: skip


def write_f16(shape: str, path: Path, seed: int) -> None:
    """The shaped model as a GGUF of F16 matrices, written tensor by tensor."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    hidden, inter, layers, heads, kv, vocab, tied = SHAPES[shape]
    reader = GGUFReader(source_gguf())
    writer = GGUFWriter(str(path), "qwen2")
    override = dict(zip(SHAPE_KEYS, (32768, hidden, inter, layers, heads, kv), strict=True))
    for field in reader.fields.values():
        key = field.name
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        short = key.removeprefix("qwen2.")
        kind = field.types[0]
        if short in override and key.startswith("qwen2."):
            writer.add_uint32(key, override[short])
        elif key == "general.name":
            writer.add_string(key, f"{shape} (shaped: random weights)")
        elif kind == GGUFValueType.ARRAY:
            writer.add_array(key, padded(key, field.contents(), vocab))
        else:
            writer.add_key_value(key, field.contents(), kind)
    writer.add_file_type(1)  # mostly F16
    layout = tensors(shape)
    for name, shp in layout:
        dtype = np.float32 if len(shp) == 1 else np.float16
        writer.add_tensor_info(name, shp, np.dtype(dtype), int(np.prod(shp)) * np.dtype(dtype).itemsize)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for i, (name, shp) in enumerate(layout):
        writer.write_tensor_data(values(name, shp, rng))
        if i % 50 == 0:
            print(f"  wrote {i + 1}/{len(layout)} tensors", file=sys.stderr, flush=True)
    writer.close()


def quantize(src: Path, dst: Path, ftype: int) -> None:
    """llama.cpp's own quantizer (llama-cpp-python's binding), 2 threads."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, 2
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), params)
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed ({rc})")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), required=True)
    p.add_argument("--type", choices=sorted(TYPES), default="Q4_K_M")
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    out = Path(args.out)
    f16 = out.with_suffix(".f16.gguf")
    start = time.perf_counter()
    write_f16(args.shape, f16, args.seed)
    print(f"F16 written: {f16.stat().st_size / 2**30:.2f} GiB in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    quantize(f16, out, TYPES[args.type])
    f16.unlink()
    print(f"{out}: {args.type}, {out.stat().st_size / 2**30:.2f} GiB, {time.perf_counter() - start:.0f} s in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
