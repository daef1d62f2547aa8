"""The OpenVINO GenAI peer's child process: openvino_genai loaded here, never in the bench's process (a
runtime that dies on this host ends this process only: `bench/peers/child.py`).

Run by path, it imports the standard library, `worker_loop.py` (its loop), numpy and OpenVINO only. The protocol is
llama_cpp_worker's (one JSON request a line on stdin, one reply a line on the original stdout):
- {"op": "load", "model", "threads", "lookup", "draft_folder", "draft_max"}: an `LLMPipeline` over the
  GGUF file (OpenVINO's own GGUF reader), on the CPU with that many inference threads, with prompt
  lookup when `lookup` > 0, or with the draft model in `draft_folder` (converted there from its
  `model.gguf` on the first load, which is then removed) drafting `draft_max` a step; replies its
  version;
- {"op": "run", "prompt", "max_new_tokens", "eos"}: greedy decoding from the prompt ids (no chat
  template: they are already the prompt), plain or speculating as loaded, stopped at the EOS ids;
  replies the tokens (ended by the EOS id, as our methods' are), the seconds (prefill included), the
  forwards (plain: one a token; speculating: its steps, from its count of tokens a step) and its own
  time to the first token (`prefill_s`);
- {"op": "close"}: exit.
"""

from __future__ import annotations

import time


class Peer:
    def __init__(self) -> None:
        self.pipe, self.drafted, self.ngrams = None, 0, False  # tokens drafted a step (0: plain)

    def load(self, model: str, threads: int, lookup: int = 0, draft_folder: str = "", draft_max: int = 5) -> dict:
        import os

        import openvino_genai

        self.drafted, self.ngrams, extra = lookup or (draft_max if draft_folder else 0), bool(lookup), {}
        if lookup:
            extra["prompt_lookup"] = True
        if draft_folder:
            gguf = os.path.join(draft_folder, "model.gguf")
            if not os.path.exists(os.path.join(draft_folder, "openvino_model.xml")):  # its first load: convert
                openvino_genai.LLMPipeline(gguf, "CPU", enable_save_ov_model=True, INFERENCE_NUM_THREADS=threads)
            if os.path.exists(gguf):  # the IR beside it is what is read from now on
                os.remove(gguf)
            extra["draft_model"] = openvino_genai.draft_model(draft_folder, "CPU", INFERENCE_NUM_THREADS=threads)
        self.pipe = openvino_genai.LLMPipeline(model, "CPU", INFERENCE_NUM_THREADS=threads, **extra)
        return {"ok": True, "system_info": f"OpenVINO GenAI {openvino_genai.__version__} (CPU plugin)"}

    def run(self, prompt: list[int], max_new_tokens: int, eos: list[int]) -> dict:
        import numpy as np
        import openvino
        import openvino_genai

        ids = np.array([prompt], dtype=np.int64)
        inputs = openvino_genai.TokenizedInputs(openvino.Tensor(ids), openvino.Tensor(np.ones_like(ids)))
        config = openvino_genai.GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False)
        config.apply_chat_template = False
        config.stop_token_ids = set(eos)
        if self.drafted:  # by prompt lookup (from 3-grams) or by the draft model
            config.num_assistant_tokens = self.drafted
        if self.ngrams:
            config.max_ngram_size = 3
        start = time.perf_counter()
        result = self.pipe.generate(inputs, config)
        wall = time.perf_counter() - start
        out = [int(t) for t in result.tokens[0]]
        if len(out) < max_new_tokens and (not out or out[-1] not in eos):  # stopped at an EOS it left out
            out.append(eos[0])
        prefill = result.perf_metrics.get_ttft().mean / 1e3
        sizes = list(result.perf_metrics.raw_metrics.m_batch_sizes) if self.drafted else [1] * len(out)
        accepted = sum(max(0, size - 1) for size in sizes)  # tokens a step beyond the one it computes
        reply = {"ok": True, "tokens": out, "wall_s": wall, "forwards": max(1, len(sizes)), "prefill_s": prefill}
        return {**reply, "accepted": accepted}


if __name__ == "__main__":
    from worker_loop import main  # beside this file: run by path, its folder is on the import path

    main(Peer())
