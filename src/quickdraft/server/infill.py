"""llama.cpp's `/infill` shape over the FIM completion (what llama.vim and llama.vscode send): the body's
`input_prefix` and `input_suffix` become a `/v1/completions` request with `suffix`, its answer llama.cpp's
`{"content", "stop", "tokens_predicted", "tokens_evaluated", "stop_type"}`. Streaming and the fields that
feed llama.cpp's extra context (`input_extra`, a `prompt` that starts the middle) are refused with 400."""

from __future__ import annotations

from quickdraft.server.protocol import APIError
from quickdraft.types import GenerationResult

# llama.cpp's /infill field -> the OpenAI completion field it means
RENAMED = {"n_predict": "max_tokens"}
KEPT = ("temperature", "top_k", "top_p", "seed", "stop", "model")
REFUSED = ("input_extra", "prompt", "stream")


def completion_body(body: object) -> dict:
    """The /v1/completions body of an /infill body (raises APIError 400 on what it cannot run)."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    for name in REFUSED:
        if body.get(name) not in (None, False, "", []):
            raise APIError(400, f"/infill: '{name}' is not supported here; use /v1/completions with 'suffix'", name)
    prefix, suffix = body.get("input_prefix", ""), body.get("input_suffix", "")
    if not isinstance(prefix, str) or not isinstance(suffix, str):
        raise APIError(400, "/infill: 'input_prefix' and 'input_suffix' must be strings", "input_prefix")
    out = {"prompt": prefix, "suffix": suffix, "return_spec_stats": True}
    for name, value in body.items():
        if name in RENAMED and not (name == "n_predict" and value == -1):  # -1: llama.cpp's "no limit"
            out[RENAMED[name]] = value
        elif name in KEPT:
            out[name] = value
    return out


def infill_response(result: GenerationResult, prompt_tokens: int, model: str) -> dict:
    """llama.cpp's /infill answer of a finished generation."""
    stop_type = "limit" if result.finish_reason == "length" else "eos"
    return {
        "content": result.text,
        "stop": True,
        "model": model,
        "tokens_predicted": len(result.token_ids),
        "tokens_evaluated": prompt_tokens,
        "stop_type": stop_type,
    }
