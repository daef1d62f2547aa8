"""PEARL with the draft and the target truly in parallel: two worker processes on torch.distributed.

Rank 0 runs the target, rank 1 the draft; each is pinned to its own CPU core(s) and uses that many
torch threads (gloo on CPU). The target worker runs the sequential driver itself (`PearlDecoder`)
with a `RemoteDraft` drafter that receives what the draft worker drafted: per round the draft sends
its new token ids (an int64 tensor) and, when sampling, only the q rows the acceptance rule needs;
the target decides (it owns the acceptance random stream) and sends back an int64 verdict
[num_accepted, next_token, done]. The draft worker runs the same `PearlLogic`. With the same seed
the tokens equal `PearlDecoder`'s exactly.

The parent holds a decoder like any other (`ParallelPearl.decoder()`, with `rounds()`): the target
worker sends each Round as it is made, so the Engine's collector, stop strings and streaming work
unchanged; when the consumer stops early a cancel flag ends the worker's generation within a round.
An exception in either worker is reported with its cause, both workers are stopped, and none is
left behind (also on Ctrl-C).
"""

from __future__ import annotations

import os
import queue
import socket
import time

import torch.multiprocessing as mp

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding.pearl_worker import DRAFT, TARGET, ParallelSpec, worker_main
from quickdraft.errors import QuickdraftError


def split_cores(available: set[int] | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Half the usable cores for the target, the rest for the draft; refuse fewer than two."""
    cores = sorted(available if available is not None else os.sched_getaffinity(0))
    if len(cores) < 2:
        raise QuickdraftError(
            f"parallel PEARL needs at least 2 CPU cores (1 for the target, 1 for the draft); this process may use "
            f"{len(cores)}. Use the sequential PEARL (parallel=0) or plain speculative decoding instead."
        )
    half = (len(cores) + 1) // 2
    return tuple(cores[:half]), tuple(cores[half:])


def worker_context():
    """Where forkserver exists (Linux), workers fork from one server process that imported the worker's
    modules once (7 s of torch and transformers on a 2-core host) instead of each importing them again
    (spawn); both start from a clean process, never a fork of this one (its threads, its OpenMP pool)."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["quickdraft.decoding.pearl_worker"])
    return ctx


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- parent side ----------------------------------------------------------------------------------


class ParallelPearl:
    """Two PEARL workers (target, draft) serving requests one at a time; `close()` (or `with`) ends them."""

    def __init__(self, spec: ParallelSpec, start_timeout_s: float = 600.0) -> None:
        self.spec = spec
        ctx = worker_context()
        self.jobs = [ctx.Queue(), ctx.Queue()]
        self.results = ctx.Queue()
        self.cancel = ctx.Event()
        port = _free_port()
        self.procs = [
            ctx.Process(target=worker_main, args=(r, spec, port, self.jobs[r], self.results, self.cancel), daemon=True)
            for r in (0, 1)
        ]
        for p in self.procs:
            p.start()
        msg = self._wait(start_timeout_s)
        if msg[0] != "ready":
            self.close()
            raise QuickdraftError(f"PEARL workers did not start: {msg}")
        self.gamma, self.costs = msg[1], msg[2]

    def decoder(self, verifier) -> ParallelPearlDecoder:
        """A decoder over these workers (`verifier`: the one the target worker builds, for labels)."""
        return ParallelPearlDecoder(self, verifier)

    def _wait(self, timeout_s: float):
        """Next message from the workers; a dead worker or an error stops both and raises."""
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                try:
                    msg = self.results.get(timeout=0.2)
                except queue.Empty:
                    dead = [(i, p.exitcode) for i, p in enumerate(self.procs) if not p.is_alive()]
                    if dead:
                        # give a dying worker's error report a moment to arrive
                        try:
                            msg = self.results.get(timeout=1.0)
                        except queue.Empty:
                            self.close()
                            who = "target" if dead[0][0] == TARGET else "draft"
                            raise QuickdraftError(
                                f"PEARL {who} worker exited with code {dead[0][1]} without a report"
                            ) from None
                    elif time.monotonic() > deadline:
                        self.close()
                        raise QuickdraftError(f"PEARL workers gave no answer in {timeout_s:.0f} s") from None
                    else:
                        continue
                if msg[0] == "error":
                    # a worker killed from outside cannot report; its peer then sees a broken
                    # connection. Name the dead one as the cause.
                    other = self.procs[DRAFT if msg[1] == "target" else TARGET]
                    other.join(timeout=0.5)
                    code = other.exitcode
                    self.close()
                    if code is not None and code < 0:
                        who = "draft" if msg[1] == "target" else "target"
                        raise QuickdraftError(
                            f"PEARL {who} worker was killed (signal {-code}); the {msg[1]} worker saw: {msg[2][:200]}"
                        )
                    raise QuickdraftError(f"PEARL {msg[1]} worker failed: {msg[2]}")
                return msg
        except KeyboardInterrupt:
            self.close()
            raise

    def rounds(self, prompt_ids, sampling: SamplingConfig, max_new_tokens: int, seed: int, timeout_s: float = 3600.0):
        """Yield the target worker's Rounds for one generation; closing early cancels it (within a round)."""
        if not self.procs:
            raise QuickdraftError("the PEARL workers are closed")
        self.cancel.clear()
        job = (list(prompt_ids), sampling, max_new_tokens, seed)
        for q in self.jobs:
            q.put(job)
        ended = False
        try:
            while True:
                msg = self._wait(timeout_s)
                if msg[0] == "end":
                    ended = True
                    return
                yield msg[1]
        finally:
            if not ended and self.procs:  # stopped early: let the workers finish the job, then drop it
                self.cancel.set()
                while self._wait(timeout_s)[0] != "end":
                    pass

    def generate(self, prompt_ids: list[int], sampling: SamplingConfig, stop: StopConfig, timeout_s: float = 3600.0):
        """One generation (EOS and budget; stop strings need the Engine, which has the tokenizer).
        The same seed gives the same tokens as the sequential PearlDecoder."""
        from quickdraft.decoding.collect import Collector, run_to_end
        from quickdraft.decoding.common import Generators
        from quickdraft.verifiers import make_verifier

        gens = Generators.from_seed(sampling.seed)
        decoder = self.decoder(make_verifier(self.spec.verifier, sampling))
        return run_to_end(decoder.rounds(prompt_ids, sampling, stop.max_new_tokens, gens), Collector(stop))

    def close(self) -> None:
        """Stop both workers (politely, then by force); never leaves a process behind."""
        for q, p in zip(self.jobs, self.procs, strict=False):
            if p.is_alive():
                try:
                    q.put(None)
                except (OSError, ValueError):
                    pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        self.procs = []

    def __enter__(self) -> ParallelPearl:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "procs", None):
            self.close()


class ParallelPearlDecoder:
    """The decoder interface over a running ParallelPearl (method "pearl" with parallel)."""

    name = "pearl"

    def __init__(self, runner: ParallelPearl, verifier) -> None:
        self.runner, self.verifier = runner, verifier
        self.lossy = verifier.lossy

    def rounds(self, prompt_ids, sampling: SamplingConfig, max_new_tokens: int, generators):
        return self.runner.rounds(prompt_ids, sampling, max_new_tokens, generators.seed)
