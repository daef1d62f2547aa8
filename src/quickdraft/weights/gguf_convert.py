"""A Llama or Qwen2 GGUF into a bf16 safetensors folder, one tensor at a time: no float32 copy, no whole copy.

transformers' GGUF loader dequantizes the whole checkpoint to float32 first (6.2 GB for a 1.5B model,
twice that while it builds the model); here each tensor is dequantized by the `gguf` package, cast to
bf16 and written in shards of at most SHARD_BYTES with transformers' index file, so the peak is one
shard and one tensor in float32 whatever the model's size (a 7B's bf16 is 15 GB). The config and
tokenizer come from transformers' GGUF readers (no tensors read there). Llama's q/k rows are unpermuted
(llama.cpp permutes them for its RoPE); Qwen2's are stored unpermuted and stay so. A model whose GGUF
holds no `output.weight` ties its LM head to the embedding.
"""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from quickdraft.errors import QuickdraftError
from quickdraft.host import folder_in_place

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}
PERMUTED = {"llama"}  # architectures whose q/k rows llama.cpp's converter permutes
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")
IN_BLOCK = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
        "output.weight": "lm_head.weight"}  # fmt: skip


def hf_name(gguf_name: str) -> str | None:
    """A GGUF tensor's Hugging Face parameter name (None for one the model does not hold, e.g. rope_freqs)."""
    if gguf_name in _TOP:
        return _TOP[gguf_name]
    match = _BLOCK.match(gguf_name)
    if match is None or match.group(2) not in IN_BLOCK:
        return None
    return f"model.layers.{match.group(1)}.{IN_BLOCK[match.group(2)]}.{match.group(3)}"


def unpermute_rows(n_rows: int, heads: int) -> torch.Tensor:
    """(n_rows,) the row order that undoes llama.cpp's q/k permutation for `heads` heads."""
    dim = n_rows // heads // 2
    return torch.arange(n_rows).reshape(heads, dim, 2).transpose(1, 2).reshape(-1)


_SCALAR = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}  # GGUF value types


@dataclass
class TensorInfo:
    """One tensor of a GGUF: its name, block type, shape in GGUF order (columns first) and its bytes as
    gguf.GGUFReader gives them: (rows, bytes a row) uint8 for block types, the values for floats."""

    name: str
    tensor_type: object  # gguf.GGMLQuantizationType
    shape: tuple[int, ...]
    data: np.ndarray


class GGUFFile:
    """A GGUF's scalar metadata and its tensors, read without `gguf.GGUFReader`'s parse of every field
    into numpy objects (a 151,936-token vocabulary: about 7 s and 1 GB each time); arrays (the vocabulary)
    are skipped. The tensors are views of one read-only memory map."""

    def __init__(self, path: Path) -> None:
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        with open(path, "rb") as f:
            self._pages = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.map = np.frombuffer(self._pages, dtype=np.uint8)
        buf = memoryview(self.map)
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", buf, 0)
        if magic != b"GGUF" or version < 2:
            raise QuickdraftError(f"{path.name}: not a GGUF file of version 2 or later")
        at, self.fields = 24, {}
        for _ in range(n_kv):
            key, at = _string(buf, at)
            (kind,), at = struct.unpack_from("<I", buf, at), at + 4
            value, at = _value(buf, at, kind)
            self.fields[key] = value
        infos = []
        for _ in range(n_tensors):
            name, at = _string(buf, at)
            (dims,), at = struct.unpack_from("<I", buf, at), at + 4
            shape, at = struct.unpack_from(f"<{dims}Q", buf, at), at + 8 * dims
            kind, offset = struct.unpack_from("<IQ", buf, at)
            at += 12
            infos.append((name, GGMLQuantizationType(kind), shape, offset))
        align = int(self.fields.get("general.alignment", 32))
        start = -(-at // align) * align
        self.tensors = []
        for name, kind, shape, offset in infos:
            block, size = GGML_QUANT_SIZES[kind]
            rows = int(np.prod(shape[1:])) if len(shape) > 1 else 1
            row_bytes = shape[0] // block * size
            raw = self.map[start + offset : start + offset + rows * row_bytes]
            if kind.name in ("F32", "F16"):
                data = raw.view(np.float32 if kind.name == "F32" else np.float16).reshape(tuple(reversed(shape)))
            else:
                data = raw.reshape(rows, row_bytes)
            self.tensors.append(TensorInfo(name, kind, tuple(int(d) for d in shape), data))

    def release(self, data: np.ndarray) -> None:
        """Drop a tensor's pages (`data`: one of `tensors`' views) from this process's resident memory, once
        it is read: a load that packs each tensor keeps one copy of the weights, not its copy plus the
        file's pages. Touched again, the pages are read back from the file."""
        advice = getattr(mmap, "MADV_DONTNEED", None)  # POSIX; not on Windows
        if advice is None or data.nbytes == 0:
            return
        start = data.__array_interface__["data"][0] - self.map.__array_interface__["data"][0]
        first = start // mmap.PAGESIZE * mmap.PAGESIZE
        self._pages.madvise(advice, first, start + data.nbytes - first)


_U64 = struct.Struct("<Q")


def _string(buf, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, at)
    return bytes(buf[at + 8 : at + 8 + n]).decode("utf-8", "replace"), at + 8 + n


def _value(buf, at: int, kind: int):
    """(value, next offset) of one metadata value; an array is skipped (None)."""
    if kind == 8:
        return _string(buf, at)
    if kind == 9:
        (item, count), at = struct.unpack_from("<IQ", buf, at), at + 12
        if item in _SCALAR:
            return None, at + count * struct.calcsize("<" + _SCALAR[item])
        if item == 8:  # strings (a vocabulary, its merges): only their lengths are read
            length = _U64.unpack_from
            for _ in range(count):
                at += 8 + length(buf, at)[0]
            return None, at
        for _ in range(count):
            _, at = _value(buf, at, item)
        return None, at
    fmt = "<" + _SCALAR[kind]
    return struct.unpack_from(fmt, buf, at)[0], at + struct.calcsize(fmt)


@contextlib.contextmanager
def one_parse_per_file():
    """While inside, `gguf.GGUFReader` is memoised by path and `gguf.get_tensor_name_map` by its
    arguments: transformers' GGUF loading parses the file anew for its config, its tokenizer and its
    weights (8.6 s a parse of the default's 49k-token vocabulary on a 2-core AVX2 host), and builds the
    name map once a module (397 times, 9 s); one of each serves. Both are only read."""
    import gguf

    originals = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = (functools.cache(f) for f in originals)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = originals


@functools.lru_cache(maxsize=1)
def open_gguf(path: Path) -> GGUFFile:
    """The GGUF at `path`, the last one kept (a load reads the file's types, then its tensors);
    `open_gguf.cache_clear()` lets it go."""
    return GGUFFile(path)


SHARD_BYTES = 1 << 30  # a conversion's shard: what it holds in memory at once, besides one float32 tensor


def bf16_items(path: Path, config: dict):
    """(Hugging Face name, bf16 tensor) of every tensor the model holds, dequantized one at a time."""
    from gguf.quants import dequantize

    reader = open_gguf(path)
    permuted = config["model_type"] in PERMUTED
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        values = torch.from_numpy(np.array(dequantize(t.data, t.tensor_type), dtype=np.float32)).reshape(
            [int(s) for s in reversed(t.shape)]
        )
        match = _BLOCK.match(t.name)
        if permuted and match is not None and match.group(2) in heads:
            values = values[unpermute_rows(values.shape[0], heads[match.group(2)])]
        yield name, values.to(torch.bfloat16).contiguous()
        del values
        reader.release(t.data)


def bf16_tensors(path: Path, config: dict) -> dict[str, torch.Tensor]:
    """{Hugging Face name: bf16 tensor} of every tensor the model holds (all in memory: a small model's)."""
    return dict(bf16_items(path, config))


def write_shards(items, folder: Path, limit: int = SHARD_BYTES) -> set[str]:
    """(name, tensor) items as `model.safetensors`, or as shards of at most `limit` bytes (a tensor
    larger than that alone) with `model.safetensors.index.json`, transformers' sharded layout; holds one
    shard at a time. Returns the names written."""
    from safetensors.torch import save_file

    shards, current, size, names = [], {}, 0, set()

    def flush() -> None:
        nonlocal current, size
        if current:
            shards.append(list(current))
            save_file(current, str(folder / f"shard-{len(shards)}.safetensors"), metadata={"format": "pt"})
            current, size = {}, 0

    for name, tensor in items:
        nbytes = tensor.numel() * tensor.element_size()
        if current and size + nbytes > limit:
            flush()
        current[name], size = tensor, size + nbytes
        names.add(name)
    flush()
    if len(shards) == 1:
        (folder / "shard-1.safetensors").rename(folder / "model.safetensors")
        return names
    files = [f"model-{i:05d}-of-{len(shards):05d}.safetensors" for i in range(1, len(shards) + 1)]
    total = 0
    for i, f in enumerate(files, 1):
        (folder / f"shard-{i}.safetensors").rename(folder / f)
        total += (folder / f).stat().st_size
    weight_map = {name: f for f, shard in zip(files, shards, strict=True) for name in shard}
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=1) + "\n")
    return names


def has_weights(folder: Path) -> bool:
    """Whether `folder` holds a converted model: its config and its weights, whole or sharded."""
    return (folder / "config.json").is_file() and any(
        (folder / f).is_file() for f in ("model.safetensors", "model.safetensors.index.json")
    )


def convert_bf16(gguf: Path, target: Path, chat: bool = True) -> Path:
    """`gguf` (a Llama or Qwen2) as a bf16 safetensors folder `target` with its tokenizer; without its
    chat template when `chat` is False. Written whole or not at all."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    with one_parse_per_file():
        parsed = load_gguf_checkpoint(str(gguf), return_tensors=False)["config"]
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    if parsed.get("model_type") not in ARCHITECTURES:
        raise QuickdraftError(
            f"{gguf.name}: bf16 conversion takes {', '.join(ARCHITECTURES)}, not {parsed.get('model_type')}"
        )
    parsed.pop("_model_name_or_path", None)
    if not chat:
        tokenizer.chat_template = None
    with folder_in_place(target) as tmp:
        names = write_shards(bf16_items(gguf, parsed), tmp)
        parsed["tie_word_embeddings"] = "lm_head.weight" not in names
        arch = [ARCHITECTURES[parsed["model_type"]]]
        config = AutoConfig.for_model(**parsed, architectures=arch, dtype="bfloat16")
        config.save_pretrained(tmp)
        ids = {k: parsed[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in parsed}
        GenerationConfig(**ids).save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / "quickdraft.json").write_text(json.dumps({"from": gguf.name, "dtype": "bfloat16"}) + "\n")
    return target
