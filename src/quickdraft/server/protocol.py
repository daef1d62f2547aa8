"""OpenAI request validation and response shapes, as pure functions (no HTTP, no models).

Every client error becomes an `APIError` (status, message, param) answered with
`{"error": {"message", "type", "param", "code"}}`. Parameters the library does not implement are
refused by name, never silently ignored; unknown extra fields are ignored (OpenAI clients send new ones).
"""

from __future__ import annotations

import math
import reprlib
import time
import uuid
from dataclasses import dataclass, field

from quickdraft.errors import QuickdraftError
from quickdraft.settings.options import RequestOptions, request_from
from quickdraft.types import GenerationResult, SpecStats


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")
        self.code = code if code is not None else status

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


# Parameter -> the value that means "off"; any other value is refused with a 400 naming it.
UNSUPPORTED = {
    "n": 1,
    "best_of": 1,
    "logprobs": None,
    "top_logprobs": None,
    "echo": False,
    "presence_penalty": 0,
    "frequency_penalty": 0,
    "repetition_penalty": 1,
    "logit_bias": None,
    "min_p": 0,
    "tools": None,
    "tool_choice": None,
    "functions": None,
    "function_call": None,
    "response_format": None,
    "use_beam_search": False,
    "min_tokens": 0,
    "stop_token_ids": None,
}


@dataclass
class CompletionRequest:
    """A validated request. Exactly one of prompt / messages is set."""

    kind: str  # "completion" | "chat"
    model: str | None
    prompt: str | list[int] | None = None
    suffix: str | None = None  # fill-in-the-middle: the text after the gap (completions only)
    messages: list[dict] | None = None
    stream: bool = False
    include_usage: bool = False
    return_spec_stats: bool = False
    options: RequestOptions = field(default_factory=RequestOptions)  # sampling, stop, max_tokens: validated


def _short(value: object, limit: int = 80) -> str:
    """repr of a client's value for an error message, cut to `limit` characters (bodies can be MBs)."""
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother = 3, limit, limit
    text = short.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_text(text: str, param: str) -> str:
    """A client string the tokenizer can take: valid Unicode (JSON allows lone surrogates, which are not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise APIError(400, f"'{param}' contains an invalid Unicode character (a lone surrogate)", param) from None
    return text


def _number(body: dict, name: str, default: float, lo: float, hi: float) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise APIError(400, f"'{name}' must be a finite number, got {_short(value)}", name)
    if not lo <= value <= hi:
        raise APIError(400, f"'{name}' must be in [{lo}, {hi}], got {value}", name)
    return float(value)


def _integer(body: dict, name: str, default: int | None, lo: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise APIError(400, f"'{name}' must be an integer, got {_short(value)}", name)
    if value < lo:
        raise APIError(400, f"'{name}' must be at least {lo}, got {value}", name)
    return value


def _check_unsupported(body: dict) -> None:
    for name, off in UNSUPPORTED.items():
        if name in body and body[name] not in (off, None) and body[name] != {} and body[name] != []:
            if name == "response_format" and body[name] == {"type": "text"}:
                continue
            raise APIError(400, f"'{name}' is not supported by this server (got {_short(body[name])})", name)


def _messages(value: object) -> list[dict]:
    if not isinstance(value, list) or not value:
        raise APIError(400, "'messages' must be a non-empty list of {role, content} objects", "messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise APIError(400, f"messages[{i}] must be an object", "messages")
        role, content = m.get("role"), m.get("content")
        if role not in ("system", "user", "assistant"):
            raise APIError(400, f"messages[{i}].role must be system, user or assistant, got {_short(role)}", "messages")
        if isinstance(content, list):  # OpenAI content parts: text only
            if not all(
                isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
            ):
                raise APIError(400, f"messages[{i}].content parts must be text parts", "messages")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise APIError(400, f"messages[{i}].content must be a string", "messages")
        out.append({"role": role, "content": _check_text(content, "messages")})
    return out


def _prompt(value: object) -> str | list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise APIError(400, "'prompt' must not be empty", "prompt")
        return _check_text(value, "prompt")
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    if isinstance(value, list) and len(value) > 1:
        raise APIError(400, "only one prompt per request is supported", "prompt")
    raise APIError(400, "'prompt' must be a non-empty string or list of token ids", "prompt")


def parse_request(body: object, kind: str, default_max_tokens: int) -> CompletionRequest:
    """Validate a JSON body for /v1/completions (kind "completion") or /v1/chat/completions ("chat")."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    _check_unsupported(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise APIError(400, "'model' must be a string", "model")
    req = CompletionRequest(kind=kind, model=model)
    if kind == "chat":
        if "messages" not in body:
            raise APIError(400, "'messages' is required", "messages")
        req.messages = _messages(body["messages"])
        max_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    else:
        if "prompt" not in body:
            raise APIError(400, "'prompt' is required", "prompt")
        req.prompt = _prompt(body["prompt"])
        if (suffix := body.get("suffix")) is not None:
            if not isinstance(suffix, str) or not isinstance(req.prompt, str):
                raise APIError(
                    400, "'suffix' must be a string, with a text 'prompt' (the code before the gap)", "suffix"
                )
            req.suffix = _check_text(suffix, "suffix")
        max_name = "max_tokens"
    settings = {
        "max_new_tokens": _integer(body, max_name, default_max_tokens, 1),
        "temperature": _number(body, "temperature", 1.0, 0.0, 2.0),  # OpenAI's range and default
        "top_p": _number(body, "top_p", 1.0, 0.0, 1.0),
        "top_k": max(0, _integer(body, "top_k", 0, -1)),  # vLLM's -1 = off
        "seed": body.get("seed"),
    }
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) or len(stops) > 4:
        raise APIError(400, "'stop' must be a non-empty string or a list of up to 4 non-empty strings", "stop")
    settings["stop"] = [_check_text(s, "stop") for s in stops]
    try:  # validated by the options table's dataclasses, as every surface's settings are
        req.options = request_from(settings)
    except QuickdraftError as exc:
        raise APIError(400, str(exc)) from None
    for flag in ("stream", "return_spec_stats"):
        value = body.get(flag, False)
        if not isinstance(value, bool):
            raise APIError(400, f"'{flag}' must be a boolean", flag)
        setattr(req, flag, value)
    options = body.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise APIError(400, "'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
        if not req.stream:
            raise APIError(400, "'stream_options' is only allowed with stream: true", "stream_options")
        req.include_usage = options.get("include_usage", False)
    return req


def spec_metrics(stats: SpecStats) -> dict:
    """vLLM's speculative-decoding counter names, per request (and the KV cache bytes it held)."""
    return {
        "speculative_decoding": {
            "num_drafts": stats.num_drafts,
            "num_draft_tokens": stats.num_draft_tokens,
            "num_accepted_tokens": stats.num_accepted_draft_tokens,
            "num_accepted_tokens_per_pos": list(stats.accepted_per_position),
            "draft_acceptance_rate": stats.draft_acceptance_rate,
            "mean_acceptance_length": stats.mean_acceptance_length,
            "num_target_forwards": stats.num_target_forwards,
            "kv_cache_bytes": stats.kv_cache_bytes,
            "lossy": stats.lossy,
            **stats.ran,
        }
    }


def usage(prompt_tokens: int, completion_tokens: int, cached: int = 0) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},  # held by a kept prefix: no forward
    }


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def full_response(req: CompletionRequest, rid: str, model: str, result: GenerationResult, prompt_tokens: int) -> dict:
    if req.kind == "chat":
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": result.text},
            "finish_reason": result.finish_reason,
            "logprobs": None,
        }
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": result.text, "finish_reason": result.finish_reason, "logprobs": None}
        obj = "text_completion"
    out = {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": usage(prompt_tokens, len(result.token_ids), result.stats.cached_prompt_tokens),
    }
    if req.return_spec_stats:
        out["metrics"] = spec_metrics(result.stats)
    return out


def chunk(
    req: CompletionRequest, rid: str, model: str, text: str | None = None, finish: str | None = None, role: bool = False
) -> dict:
    """One streaming chunk: a text delta, a role announcement (chat) or the finish marker."""
    if req.kind == "chat":
        delta: dict = {"role": "assistant", "content": ""} if role else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "finish_reason": finish, "logprobs": None}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}


def final_chunk(req: CompletionRequest, rid: str, model: str, result: GenerationResult, prompt_tokens: int) -> dict:
    """The usage chunk after the finish chunk (choices empty), with statistics if asked for."""
    out = {
        "id": rid,
        "object": "chat.completion.chunk" if req.kind == "chat" else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, len(result.token_ids), result.stats.cached_prompt_tokens),
    }
    if req.return_spec_stats:
        out["metrics"] = spec_metrics(result.stats)
    return out
