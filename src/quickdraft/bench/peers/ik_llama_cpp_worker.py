"""The ik_llama.cpp peer's child process: ik-llama-cpp-python (module `ik_llama_cpp`) loaded here, never in
the bench's process (a build that dies on this host ends this process only: `bench/peers/child.py`).

Run by path, it imports the standard library, `worker_loop.py` (its loop) and ik_llama_cpp only. The
protocol is llama_cpp_worker's (one JSON request a line on stdin, one reply a line on the original stdout):
- {"op": "load", "model", "n_ctx", "threads"}: the model; replies its build's system info;
- {"op": "run", "prompt", "max_new_tokens", "eos"}: greedy plain decoding from the prompt ids; replies
  the tokens (ended by the EOS id it stopped at, as our methods' are), the seconds (prefill included),
  the forwards (one a token) and `prefill_s`, the prompt's prefill timed alone by a call before the run;
- {"op": "close"}: exit.
"""

from __future__ import annotations

import os
import time


class Peer:
    def __init__(self) -> None:
        self.llm = None

    def load(self, model: str, n_ctx: int, threads: int) -> dict:
        import ctypes
        import importlib.util

        # a build from the sdist leaves libllama.so without a path to the libggml.so beside it (the
        # PyPI wheel bundles both): load that one first, globally, so the binding's load finds it
        folder = os.path.join(os.path.dirname(importlib.util.find_spec("ik_llama_cpp").origin), "lib")
        if os.path.exists(os.path.join(folder, "libggml.so")):
            ctypes.CDLL(os.path.join(folder, "libggml.so"), mode=ctypes.RTLD_GLOBAL)
        import ik_llama_cpp

        self.llm = ik_llama_cpp.IkLlama(model, n_ctx=n_ctx, n_threads=threads, n_seq_max=1, verbose=False)
        try:  # the build's instruction sets, as llama.cpp prints them
            from ik_llama_cpp import _ctypes_api

            lib = next(v for v in vars(_ctypes_api).values() if isinstance(v, ctypes.CDLL))
            lib.llama_print_system_info.restype = ctypes.c_char_p
            info = lib.llama_print_system_info().decode()
        except Exception:  # an older binding: the run goes on without it
            info = "ik_llama.cpp (system info not exposed)"
        return {"ok": True, "system_info": info}

    def run(self, prompt: list[int], max_new_tokens: int, eos: list[int]) -> dict:
        start = time.perf_counter()  # its binding decodes in one call: the prefill is timed alone first
        self.llm.generate(list(prompt), max_tokens=0, temperature=0.0)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        out = [int(t) for t in self.llm.generate(list(prompt), max_tokens=max_new_tokens, temperature=0.0)]
        wall = time.perf_counter() - start
        if len(out) < max_new_tokens:  # it stopped at an end-of-generation token, which it does not return
            try:
                out.append(int(self.llm._context.sample(-1, temperature=0.0, top_k=40, top_p=0.95)))
            except Exception:
                out.append(eos[0])
        return {"ok": True, "tokens": out, "wall_s": wall, "forwards": len(out), "prefill_s": prefill}


if __name__ == "__main__":
    from worker_loop import main  # beside this file: run by path, its folder is on the import path

    main(Peer())
