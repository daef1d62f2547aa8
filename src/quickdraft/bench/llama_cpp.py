"""llama.cpp as a peer in the bench: plain greedy decoding of the target's GGUF through llama-cpp-python
(`llama-cpp`), and llama.cpp's own prompt-lookup speculation (`llama-cpp:lookup=N`, llama-cpp-python's
`LlamaPromptLookupDecoding`).

It is fed what our methods are fed: the same prompt token ids (the prefill is timed, as ours is), the
same token budget, EOS ids and thread count. `quantize=` picks its weights: the GGUF as shipped
(`gguf`, the default) or a copy requantized once with llama.cpp's own quantize API and cached under
the quickdraft cache (`q4_0`, `q4_1`, `q8_0`, `bf16`). Its weights differ from ours, so its rows
report agreement with our plain decoding apart from the lossless match (which, for `lookup`, is
against llama.cpp's own plain decoding of the same weights).

Needs the optional extra: `pip install -e ".[peers]"` (llama-cpp-python, built from its sdist).
"""

from __future__ import annotations

import time
from pathlib import Path

from quickdraft.bench.outputs import RunOutput
from quickdraft.errors import QuickdraftError
from quickdraft.weights.default import cache_dir
from quickdraft.weights.loading import LoadedModel

KEYS = ("quantize", "lookup")
# llama.cpp's file types (llama.h: LLAMA_FTYPE_MOSTLY_*) for the requantized copies
FTYPES = {"q4_0": 2, "q4_1": 3, "q8_0": 7, "bf16": 32}
QUANTS = ("gguf", *FTYPES)


def _llama_cpp():
    try:
        import llama_cpp
    except ImportError:
        raise QuickdraftError(
            'the llama-cpp peer needs llama-cpp-python: pip install -e ".[peers]" (builds it from source, ~6 min)'
        ) from None
    return llama_cpp


def quantized_copy(gguf: Path, quant: str) -> Path:
    """The GGUF in `quant` weights: the file itself for "gguf", else a copy requantized once with
    llama.cpp's `llama_model_quantize` (2 threads) and cached under the quickdraft cache."""
    if quant not in QUANTS:
        raise QuickdraftError(f"llama-cpp: quantize must be one of {', '.join(QUANTS)}, not {quant!r}")
    if quant == "gguf":
        return gguf
    out = cache_dir() / "llama_cpp" / f"{gguf.stem}-{quant}.gguf"
    if not out.exists():
        lib = _llama_cpp()
        out.parent.mkdir(parents=True, exist_ok=True)
        params = lib.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread = FTYPES[quant], True, 2
        tmp = out.with_suffix(".partial")
        if lib.llama_model_quantize(str(gguf).encode(), str(tmp).encode(), params) != 0:
            raise QuickdraftError(f"llama-cpp: quantizing {gguf.name} to {quant} failed")
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
    """A bench method running llama.cpp on the target's GGUF (plain, or with prompt lookup)."""

    speculative = False

    def __init__(self, spec, target: LoadedModel, dtype: str, runtime: str = "auto", quantize: str = "none") -> None:
        import torch

        lib = _llama_cpp()
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
        self.drafts: list[tuple[int, list[int]]] = []
        draft = None
        if self.speculative:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            outer = self

            class Recorded(LlamaPromptLookupDecoding):  # records each draft (where, which tokens)
                def __call__(self, input_ids, **kwargs):
                    out = super().__call__(input_ids, **kwargs)
                    outer.drafts.append((len(input_ids), [int(t) for t in out]))
                    return out

            draft = Recorded(num_pred_tokens=self.lookup)
        threads = torch.get_num_threads()
        context = min(int(getattr(target.model.config, "max_position_embeddings", 4096)), 4096)
        self.llm = lib.Llama(
            model_path=str(quantized_copy(target.gguf, self.quant)),
            n_ctx=context,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            draft_model=draft,
            # with a draft model, llama-cpp-python keeps every row's logits but sizes that buffer by this
            # flag, not by the draft (0.3.36): past n_batch positions it fails unless told
            logits_all=self.speculative,
            verbose=False,
        )
        self.eos = set(target.eos_token_ids)
        self.forwards = 0
        evaluate = self.llm.eval

        def counted(tokens):  # one llama_decode per call: a target forward
            self.forwards += 1
            return evaluate(tokens)

        self.llm.eval = counted

    @property
    def weights(self) -> str:
        return f"llama-cpp:{self.quant}"

    def run(self, prompt_ids: list[int], max_new_tokens: int):
        self.forwards, self.drafts = 0, []
        self.llm.reset()  # no prefix reuse between runs: the prompt is prefilled every time, as ours
        out: list[int] = []
        start = time.perf_counter()
        for token in self.llm.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            out.append(int(token))
            if len(out) >= max_new_tokens or token in self.eos:
                break
        wall = time.perf_counter() - start
        drafted = sum(len(d) for _, d in self.drafts)
        accepted = lookup_accepted(len(prompt_ids), out, self.drafts)
        return RunOutput(out, wall, self.forwards, len(self.drafts), drafted, accepted)

    def close(self) -> None:
        self.llm.close()
