"""Which methods a bench run measures: the requested ones, plain decoding first, and plain decoding of
every other weight form they use (what "lossless" compares each method with)."""

from __future__ import annotations

from quickdraft.bench.methods import PEER_CLASSES, PEERS, MethodSpec, parse_methods
from quickdraft.errors import QuickdraftError

GGUF_PEERS = ("llama-cpp", "ik-llama-cpp", "openvino")  # peers that decode the target's GGUF (their own weights)


def _weights(spec: MethodSpec, default: str) -> str:
    """The weights a method runs on: its own quantize key, else the bench's; transformers' peers: the
    loaded weights; llama.cpp: its GGUF ("llama-cpp:gguf") or a requantized copy ("llama-cpp:q4_0")."""
    if spec.name in GGUF_PEERS:
        return f"{spec.name}:{spec.get('quantize', 'gguf')}"
    return "none" if spec.name in PEER_CLASSES else spec.get("quantize", default)


def _sampled(spec: MethodSpec) -> bool:
    """A run that samples (`temperature=` above 0; an unreadable value counts, its build refuses it)."""
    try:
        return float(spec.get("temperature", "0")) > 0
    except ValueError:
        return True


def _is_plain(spec: MethodSpec) -> bool:
    """Greedy plain decoding of its weights (what lossless compares with): ar, or llama-cpp without
    lookup or draft."""
    if spec.name == "ar":
        return not _sampled(spec)
    return spec.name in GGUF_PEERS and spec.get("lookup") is None and spec.get("draft") is None


def _plain_for(weights: str) -> MethodSpec:
    name, _, quant = weights.partition(":")
    if name in GGUF_PEERS:
        return MethodSpec(name, (("quantize", quant),) if "quantize" in PEERS[name] else ())
    return MethodSpec("ar", (("quantize", weights),))


def _methods_with_ar(text: str, default: str = "none") -> list[MethodSpec]:
    """The methods, with plain decoding first, and plain decoding of every other weight form used
    (what "lossless" compares with; llama.cpp's own plain decoding for its weights)."""
    specs = parse_methods(text)
    if not any(s.text == "ar" for s in specs):
        specs.insert(0, MethodSpec("ar"))
    for q in dict.fromkeys(_weights(s, default) for s in specs):
        if not any(_is_plain(s) and _weights(s, default) == q for s in specs):
            specs.insert(1, _plain_for(q))
    if len({s.text for s in specs}) != len(specs):
        raise QuickdraftError("a method is listed twice")
    return specs
