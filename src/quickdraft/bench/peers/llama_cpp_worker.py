"""The llama.cpp peer's child process: llama-cpp-python loaded here, never in the bench's process.

A llama.cpp build that does not run on the host dies with a signal (an AMX `tilezero` on an Intel
Xeon VM was SIGILL, issue #47); here that death ends this process only, and the parent
(`bench/peers/child.py`) reports it as one method's failure. Run by path (`python
llama_cpp_worker.py`), so it imports the standard library, `worker_loop.py` (its loop) and llama_cpp
only, not quickdraft (nor torch).

Protocol: one JSON object a line on stdin, one reply a line on the original stdout (llama.cpp's own
prints go to stderr). Requests:
- {"op": "quantize", "model", "ftype", "out", "pure"}: a requantized copy (llama_model_quantize, 2 threads;
  `pure`: every tensor in that type where it can be);
- {"op": "load", "model", "n_ctx", "threads", "lookup", "logits_all"}: the model (and prompt lookup
  with `lookup` tokens when > 0, every row's logits kept with `logits_all`); replies the build's
  system info;
- {"op": "run", "prompt", "max_new_tokens", "eos", "lookup"}: greedy decoding from the prompt ids,
  plain or with prompt lookup (`lookup`: its tokens, 0 plain; absent: as loaded); replies the tokens,
  the seconds it took (prefill included) and to its first token (`prefill_s`), the forwards
  (llama_decode calls) and each draft (where it was proposed, its tokens);
- {"op": "close"}: exit.
A failure that Python sees replies {"error": "..."}; the loop goes on.
"""

from __future__ import annotations

import os
import time


class Peer:
    """The loaded model and what its last run recorded."""

    def __init__(self) -> None:
        self.llm = None
        self.forwards = 0
        self.drafts: list[tuple[int, list[int]]] = []

    def quantize(self, model: str, ftype: int, out: str, pure: bool = False) -> dict:
        import llama_cpp

        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.allow_requantize, params.nthread, params.pure = ftype, True, 2, pure
        if llama_cpp.llama_model_quantize(model.encode(), out.encode(), params) != 0:
            return {"error": f"llama_model_quantize failed for {os.path.basename(model)}"}
        return {"ok": True}

    def load(self, model: str, n_ctx: int, threads: int, lookup: int = 0, logits_all: bool = True) -> dict:
        """The model, once for every method on it: plain and prompt-lookup runs share its weights (and
        llama.cpp's repacked copy of them, about 700 MB of the 1.5B's). Its scores buffer is sized for
        every row (untouched rows take no memory); each run says whether it keeps them (`run`)."""
        import llama_cpp

        self.llm = llama_cpp.Llama(
            model_path=model,
            n_ctx=n_ctx,
            n_batch=512,
            n_threads=threads,
            n_threads_batch=threads,
            # with a draft model, llama-cpp-python keeps every row's logits but sizes that buffer by this
            # flag, not by the draft (0.3.36): past n_batch positions it fails unless told
            logits_all=True,
            verbose=False,
        )
        self.mode(lookup, logits_all)
        evaluate = self.llm.eval

        def counted(tokens):  # one llama_decode per call: a target forward
            self.forwards += 1
            return evaluate(tokens)

        self.llm.eval = counted
        info = llama_cpp.llama_print_system_info()
        return {"ok": True, "system_info": info.decode() if isinstance(info, bytes) else str(info)}

    def mode(self, lookup: int, logits_all: bool = False) -> None:
        """Plain decoding (only the last row's logits, as a plain load computes them) or llama.cpp's
        prompt lookup with `lookup` tokens (every row's logits, as it needs), for the runs that follow."""
        draft = None
        if lookup > 0:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            peer = self

            class Recorded(LlamaPromptLookupDecoding):  # records each draft (where, which tokens)
                def __call__(self, input_ids, **kwargs):
                    out = super().__call__(input_ids, **kwargs)
                    peer.drafts.append((len(input_ids), [int(t) for t in out]))
                    return out

            draft = Recorded(num_pred_tokens=lookup)
        self.llm.draft_model = draft
        self.llm._logits_all = logits_all or draft is not None  # llama-cpp-python's per-call switch (0.3.36)

    def run(self, prompt: list[int], max_new_tokens: int, eos: list[int], lookup: int | None = None) -> dict:
        if lookup is not None:
            self.mode(lookup)
        self.forwards, self.drafts = 0, []
        self.llm.reset()  # no prefix reuse between runs: the prompt is prefilled every time, as ours
        out: list[int] = []
        stop = set(eos)
        start, first = time.perf_counter(), None
        for token in self.llm.generate(prompt, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            first = first or time.perf_counter()  # the prompt's prefill and its first token
            out.append(int(token))
            if len(out) >= max_new_tokens or token in stop:
                break
        wall = time.perf_counter() - start
        prefill = (first or start) - start
        return {
            "ok": True,
            "tokens": out,
            "wall_s": wall,
            "forwards": self.forwards,
            "drafts": self.drafts,
            "prefill_s": prefill,
        }

    def argmax(self, tokens: list[int]) -> dict:
        """Teacher-forced: the top-1 id after each prefix of `tokens` (every row's logits kept)."""
        self.mode(0, logits_all=True)
        self.llm.reset()
        self.llm.eval(tokens)
        return {"ok": True, "argmax": [int(i) for i in self.llm.scores[: len(tokens)].argmax(-1)]}


if __name__ == "__main__":
    from worker_loop import main  # beside this file: run by path, its folder is on the import path

    main(Peer())
