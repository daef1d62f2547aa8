"""PEARL with the draft and the target truly in parallel: two worker processes on torch.distributed.

Rank 0 runs the target, rank 1 the draft; each is pinned to its own CPU core(s) and uses that many
torch threads (gloo on CPU). Both ranks run the same `PearlLogic`; per round the draft sends its new
token ids (an int64 tensor) and, when sampling, only the q rows the acceptance rule needs; the target
decides (it owns the acceptance random stream) and sends back an int64 verdict
[num_accepted, next_token, done]. With the same seed the tokens equal `PearlDecoder`'s exactly.

The parent process only hands out requests and collects results. An exception in either worker is
reported with its cause, both workers are stopped, and none is left behind (also on Ctrl-C).
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from quickdraft.config import SamplingConfig, StopConfig
from quickdraft.decoding.pearl import PearlConfig, PearlLogic, PearlVerdict, gamma_from_costs, step_seconds
from quickdraft.errors import QuickdraftError
from quickdraft.types import GenerationResult

TARGET, DRAFT = 0, 1


@dataclass(frozen=True)
class ParallelSpec:
    """What the workers load: target folder (None = embedded default), drafter spec, dtype, cores."""

    target: str | None
    drafter: str
    dtype: str
    pearl: PearlConfig
    verifier: str | None
    cores: tuple[tuple[int, ...], tuple[int, ...]]


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- worker side ----------------------------------------------------------------------------------


def _worker(rank: int, spec: ParallelSpec, port: int, jobs, results) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl-C and stops us
    try:
        os.sched_setaffinity(0, set(spec.cores[rank]))
        torch.set_num_threads(len(spec.cores[rank]))
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2, timeout=timedelta(seconds=600)
        )
        role = _TargetRole(spec) if rank == TARGET else _DraftRole(spec)
        costs = torch.zeros(2, dtype=torch.float64)
        costs[rank] = role.step_seconds() or -1.0  # -1: a drafter with no model
        dist.all_reduce(costs)
        draft_s = float(costs[DRAFT]) if costs[DRAFT] > 0 else None
        gamma = spec.pearl.gamma or gamma_from_costs(float(costs[TARGET]), draft_s)
        if rank == TARGET:
            results.put(("ready", gamma, costs.tolist()))
        while True:
            job = jobs.get()
            if job is None:
                break
            out = role.run(job, gamma)
            if rank == TARGET:
                results.put(("result", out))
        dist.destroy_process_group()
    except BaseException as exc:  # report the cause, then die: the parent stops the other worker
        role_name = "target" if rank == TARGET else "draft"
        results.put(("error", role_name, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        results.close()
        results.join_thread()  # flush the report before dying
        os._exit(1)


class _Role:
    def __init__(self, spec: ParallelSpec) -> None:
        from quickdraft.models.loading import load_model

        self.spec = spec
        self.target_loaded = load_model(spec.target, spec.dtype)

    @staticmethod
    def _send(t: torch.Tensor, dst: int) -> None:
        dist.send(t.contiguous(), dst)

    @staticmethod
    def _recv(shape, dtype, src: int) -> torch.Tensor:
        t = torch.empty(shape, dtype=dtype)
        dist.recv(t, src)
        return t


class _DraftRole(_Role):
    def __init__(self, spec: ParallelSpec) -> None:
        super().__init__(spec)
        from quickdraft.drafters import make_drafter

        self.drafter = make_drafter(spec.drafter, self.target_loaded, spec.dtype)
        del self.target_loaded  # the draft worker keeps only the draft

    def step_seconds(self) -> float | None:
        model = getattr(self.drafter, "model", None)
        return step_seconds(model) if model is not None else None

    def run(self, job, gamma: int) -> None:
        from quickdraft.decoding.common import Generators

        prompt, sampling, stop, seed = job
        gens = Generators.from_seed(seed)
        self.drafter.begin(prompt)
        first = int(self._recv((1,), torch.long, TARGET)[0])
        if first < 0:
            return
        cfg = self.spec.pearl
        logic = PearlLogic(prompt + [first], gamma, cfg.pre_verify, cfg.post_verify, len(prompt) + stop.max_new_tokens)
        while True:
            drafted, q = [], None
            job_d = logic.draft_job()
            if job_d is not None:
                context, k = job_d
                if k > 0:
                    prop = self.drafter.propose(context, k, sampling, gens.draft, None)
                    drafted, q = prop.tokens.tolist(), prop.q_probs
                header = torch.tensor([len(drafted), int(q is not None), *drafted], dtype=torch.long)
                self._send(torch.tensor([header.numel()]), TARGET)
                self._send(header, TARGET)
                if q is not None:
                    self._send(q.float(), TARGET)
            if logic.target_job() is None:
                logic.apply(None, drafted, q)
                continue
            n, nxt, done = self._recv((3,), torch.long, TARGET).tolist()
            logic.apply(PearlVerdict(n, nxt), drafted, q)
            if done:
                return


class _TargetRole(_Role):
    def __init__(self, spec: ParallelSpec) -> None:
        super().__init__(spec)
        from quickdraft.models.cached_model import CachedModel
        from quickdraft.verifiers import make_verifier

        self.loaded = self.target_loaded
        self.target = CachedModel(self.loaded.model, self.loaded.vocab_size)
        self.make_verifier = make_verifier

    def step_seconds(self) -> float:
        return step_seconds(self.target)

    def run(self, job, gamma: int) -> GenerationResult:
        from quickdraft.decoding.collect import Collector
        from quickdraft.decoding.common import Generators, prefill_step
        from quickdraft.sampling import logits_to_probs

        prompt, sampling, stop, seed = job
        gens = Generators.from_seed(seed)
        verifier = self.make_verifier(self.spec.verifier, sampling)
        tok = self.loaded.tokenizer
        collector = Collector(stop, (lambda ids: tok.decode(ids, skip_special_tokens=True)) if tok else None)
        collector.stats.lossy, collector.stats.verifier = verifier.lossy, verifier.name
        first = prefill_step(self.target, prompt, sampling, gens.target)
        collector.feed(first)
        self._send(torch.tensor([-1 if collector.done else first.tokens[0]]), DRAFT)
        if collector.done:
            return collector.result()
        cfg = self.spec.pearl
        logic = PearlLogic(
            prompt + first.tokens, gamma, cfg.pre_verify, cfg.post_verify, len(prompt) + stop.max_new_tokens
        )
        while True:
            start = time.perf_counter()
            feed = logic.target_job()
            p = logits_to_probs(self.target.extend(feed), sampling) if feed is not None else None
            drafted, q = [], None
            if logic.draft_job() is not None:
                size = int(self._recv((1,), torch.long, DRAFT)[0])
                header = self._recv((size,), torch.long, DRAFT).tolist()
                drafted = header[2 : 2 + header[0]]
                if header[1]:
                    q = self._recv((header[0], self.target.vocab_size), torch.float32, DRAFT)
            if feed is None:
                logic.apply(None, drafted, q)
                continue
            verdict = logic.judge(drafted, q, p, verifier, gens.target)
            rnd = logic.apply(verdict, drafted, q)
            self.target.rollback(logic.target_cache_length)
            rnd.verify_s = time.perf_counter() - start
            collector.feed(rnd)
            self._send(torch.tensor([verdict.num_accepted, verdict.next_token, int(collector.done)]), DRAFT)
            if collector.done:
                return collector.result()


# --- parent side ----------------------------------------------------------------------------------


class ParallelPearl:
    """Two PEARL workers (target, draft) serving requests one at a time; `close()` (or `with`) ends them."""

    def __init__(self, spec: ParallelSpec, start_timeout_s: float = 600.0) -> None:
        self.spec = spec
        ctx = mp.get_context("spawn")
        self.jobs = [ctx.Queue(), ctx.Queue()]
        self.results = ctx.Queue()
        port = _free_port()
        self.procs = [
            ctx.Process(target=_worker, args=(r, spec, port, self.jobs[r], self.results), daemon=True) for r in (0, 1)
        ]
        for p in self.procs:
            p.start()
        msg = self._wait(start_timeout_s)
        if msg[0] != "ready":
            self.close()
            raise QuickdraftError(f"PEARL workers did not start: {msg}")
        self.gamma, self.costs = msg[1], msg[2]

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

    def generate(self, prompt_ids: list[int], sampling: SamplingConfig, stop: StopConfig, timeout_s: float = 3600.0):
        """One generation; the same seed gives the same tokens as the sequential PearlDecoder."""
        if not self.procs:
            raise QuickdraftError("the PEARL workers are closed")
        seed = sampling.seed if sampling.seed is not None else int.from_bytes(os.urandom(7), "little")
        job = (list(prompt_ids), sampling, stop, seed)
        start = time.perf_counter()
        for q in self.jobs:
            q.put(job)
        result = self._wait(timeout_s)[1]
        result.stats.wall_s = time.perf_counter() - start  # measured here: hand-off and return included
        return result

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
