"""llama.cpp as a peer in the bench: plain greedy decoding of the target's GGUF through llama-cpp-python
(`llama-cpp`), and llama.cpp's own prompt-lookup speculation (`llama-cpp:lookup=N`, llama-cpp-python's
`LlamaPromptLookupDecoding`).

It is fed what our methods are fed: the same prompt token ids (the prefill is timed, as ours is), the
same token budget, EOS ids and thread count. `quantize=` picks its weights: the GGUF as shipped
(`gguf`, the default) or a copy requantized once with llama.cpp's own quantize API and cached under
the quickdraft cache (`q4_0`, `q4_1`, `q8_0`, `bf16`). Its weights differ from ours, so its rows
report agreement with our plain decoding apart from the lossless match (which, for `lookup`, is
against llama.cpp's own plain decoding of the same weights).

llama.cpp runs in a child process (`bench/peers/llama_cpp_worker.py`, `bench/peers/child.py`): a build
that dies on this host (a signal) fails this method with one line, not the bench (issue #47).

Needs the optional extra: `pip install -e ".[peers]"` (llama-cpp-python, built from its sdist with
the flags of `scripts/llama_cpp_cmake_args.py`: this CPU's instruction sets, AMX off).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from quickdraft.bench.outputs import RunOutput
from quickdraft.bench.peers.child import ChildPeer
from quickdraft.bench.peers.gguf_peer import peer_context
from quickdraft.errors import QuickdraftError
from quickdraft.host import cache_dir
from quickdraft.weights.loading import LoadedModel

KEYS = ("quantize", "lookup")
# llama.cpp's file types (llama.h: LLAMA_FTYPE_MOSTLY_*) for the requantized copies
FTYPES = {
    "q4_0": 2,
    "q4_1": 3,
    "q8_0": 7,
    "bf16": 32,
    "q5_1": 9,
    "q2_k": 10,
    "q3_k_m": 12,
    "q4_k_m": 15,
    "q5_k_m": 17,
    "q6_k": 18,
    "iq4_nl": 25,
    "iq4_xs": 30,
}
QUANTS = ("gguf", *FTYPES)


WORKER = Path(__file__).with_name("llama_cpp_worker.py")


def _llama_cpp_installed() -> None:
    """Refuse clearly when the extra is missing (found without importing it: it loads in a child)."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise QuickdraftError(
            'the llama-cpp peer needs llama-cpp-python: pip install -e ".[peers]" (builds it from source, ~6 min)'
        )


def quantized_copy(gguf: Path, quant: str) -> Path:
    """The GGUF in `quant` weights: the file itself for "gguf", else a copy requantized once with
    llama.cpp's `llama_model_quantize` (2 threads, in a child process) and cached under the quickdraft cache.
    A "-pure" suffix ("q2_k-pure") quantizes every tensor it can to that type (llama.cpp's `--pure`: no
    finer types for the sensitive ones)."""
    pure = quant.endswith("-pure")
    if quant.removesuffix("-pure") not in QUANTS or (pure and quant == "gguf-pure"):
        raise QuickdraftError(f"llama-cpp: quantize must be one of {', '.join(QUANTS)}, not {quant!r}")
    if quant == "gguf":
        return gguf
    out = cache_dir() / "llama_cpp" / f"{gguf.stem}-{quant}.gguf"
    if not out.exists():
        _llama_cpp_installed()
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".partial")
        child = ChildPeer(f"llama-cpp:quantize={quant}", WORKER)
        try:
            child.call("quantize", model=str(gguf), ftype=FTYPES[quant.removesuffix("-pure")], out=str(tmp), pure=pure)
        finally:
            child.close()
        tmp.rename(out)
    return out


def lookup_accepted(prompt_len: int, output: list[int], drafts: list[tuple[int, list[int]]]) -> int:
    """Draft tokens greedy verification kept: each draft (proposed after `at` tokens of prompt and
    output) is accepted up to its first token that differs from the output there."""
    accepted = 0
    for at, draft in drafts:
        for i, token in enumerate(draft):
            j = at - prompt_len + i
            if j >= len(output) or output[j] != token:
                break
            accepted += 1
    return accepted


class LlamaCppMethod:
    """A bench method running llama.cpp on the target's GGUF (plain, or with prompt lookup), in a
    child process (`bench/peers/child.py`): its crash is this method's failure (`PeerCrashed`)."""

    speculative = False

    def __init__(self, spec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none") -> None:
        import torch

        _llama_cpp_installed()
        if target.gguf is None:
            raise QuickdraftError(f"{spec.text}: the target {target.name} was not loaded from a GGUF file")
        self.spec, self.quant = spec, spec.get("quantize", "gguf")
        lookup = spec.get("lookup")
        try:
            self.lookup = int(lookup) if lookup is not None else 0
        except ValueError:
            raise QuickdraftError(f"{spec.text}: lookup must be an integer") from None
        if self.lookup < 0:
            raise QuickdraftError(f"{spec.text}: lookup must be >= 1")
        self.speculative = self.lookup > 0
        model = quantized_copy(target.gguf, self.quant)
        context = peer_context(target)
        self.eos = sorted(target.eos_token_ids)
        self.key = (str(model), context, torch.get_num_threads())
        self.child, self.system_info = shared_worker(spec.text, self.key)

    @property
    def weights(self) -> str:
        return f"llama-cpp:{self.quant}"

    def run(self, prompt_ids: list[int], max_new_tokens: int):
        got = self.child.call(
            "run", prompt=list(prompt_ids), max_new_tokens=max_new_tokens, eos=self.eos, lookup=self.lookup
        )
        out, drafts = got["tokens"], [(at, draft) for at, draft in got["drafts"]]
        drafted = sum(len(d) for _, d in drafts)
        accepted = lookup_accepted(len(prompt_ids), out, drafts)
        output = RunOutput(out, got["wall_s"], got["forwards"], len(drafts), drafted, accepted)
        output.prefill_s = got.get("prefill_s")
        return output

    def close(self) -> None:
        release_worker(self.key)


# One worker a model: the bench's llama.cpp methods on one GGUF (plain and prompt lookup) share its
# process, so the weights and llama.cpp's repacked copy of them are loaded once (issue #49's 8 GB: each
# worker of the 1.5B held about 800 MB of its own). key (model, n_ctx, threads) -> [child, info, users]
WORKERS: dict[tuple[str, int, int], list] = {}


def shared_worker(name: str, key: tuple[str, int, int]) -> tuple[ChildPeer, str]:
    """The worker holding `key`'s model (started and loaded by its first user) and the build's system
    info; a failed load stops it and raises (the method fails, the bench goes on)."""
    if key not in WORKERS:
        child = ChildPeer(name, WORKER)
        try:
            loaded = child.call("load", model=key[0], n_ctx=key[1], threads=key[2])
        except QuickdraftError:
            child.close()
            raise
        WORKERS[key] = [child, loaded["system_info"], 0]
    WORKERS[key][2] += 1
    return WORKERS[key][0], WORKERS[key][1]


def release_worker(key: tuple[str, int, int]) -> None:
    """One user fewer; the last one stops the worker."""
    entry = WORKERS.get(key)
    if entry is None:
        return
    entry[2] -= 1
    if entry[2] <= 0:
        entry[0].close()
        del WORKERS[key]
