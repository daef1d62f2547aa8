"""The two worker processes of parallel PEARL (see `pearl_parallel.py` for the protocol).

The target worker runs the sequential driver (`PearlDecoder.rounds`) with a `RemoteDraft` drafter;
the draft worker runs the same `PearlLogic` and drafts with the real drafter.
"""

from __future__ import annotations

import os
import signal
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from quickdraft.costs.timing import step_seconds
from quickdraft.decoding.pearl import PearlDecoder, gamma_from_costs
from quickdraft.decoding.pearl_logic import PearlConfig, PearlLogic, PearlVerdict
from quickdraft.drafters.base import Drafter, DraftRequest, drafter_step_seconds
from quickdraft.drafters.spec import DrafterSpec
from quickdraft.runtime.quant.modes import QuantSpec
from quickdraft.verifiers.tree import TokenTree

TARGET, DRAFT = 0, 1


@dataclass(frozen=True)
class ParallelSpec:
    """What the workers load: the target (a folder or a named target; None = the embedded default), the
    drafter's parsed stages, dtype, cores."""

    target: str | None
    drafter: tuple[DrafterSpec, ...]
    dtype: str
    pearl: PearlConfig
    verifier: str | None
    cores: tuple[tuple[int, ...], tuple[int, ...]]
    runtime: str = "auto"
    quant: QuantSpec = QuantSpec()  # the engine's parsed --quantize (EngineConfig.quant)

    def __post_init__(self) -> None:  # both workers read one decided pre-verify (auto: on in two processes)
        object.__setattr__(self, "pearl", self.pearl.resolved(parallel=True))


# --- worker side ----------------------------------------------------------------------------------


def worker_main(rank: int, spec: ParallelSpec, port: int, jobs, results, cancel) -> None:
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
            if rank == TARGET:
                role.run(job, gamma, results, cancel)
            else:
                role.run(job, gamma)
        dist.destroy_process_group()
    except BaseException as exc:  # report the cause, then die: the parent stops the other worker
        role_name = "target" if rank == TARGET else "draft"
        results.put(("error", role_name, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        results.close()
        results.join_thread()  # flush the report before dying
        os._exit(1)


def _send(t: torch.Tensor, dst: int) -> None:
    dist.send(t.contiguous(), dst)


def _recv(shape, dtype, src: int) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype)
    dist.recv(t, src)
    return t


class RemoteDraft(Drafter):
    """The target worker's drafter: `propose` receives what the draft worker drafted for the same
    (context, k); both workers derive (context, k) from the same PearlLogic state."""

    name = "remote"

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def propose(self, context, request: DraftRequest, sampling, generator) -> TokenTree:
        size = int(_recv((1,), torch.long, DRAFT)[0])
        header = _recv((size,), torch.long, DRAFT).tolist()
        tokens = header[2 : 2 + header[0]]
        q = _recv((header[0], self.vocab_size), torch.float32, DRAFT) if header[1] else None
        return TokenTree.path(tokens, q)


class _DraftRole:
    def __init__(self, spec: ParallelSpec) -> None:
        from quickdraft.drafters import make_drafter
        from quickdraft.weights.loading import load_model

        self.spec = spec
        self.drafter = make_drafter(spec.drafter, load_model(spec.target, spec.dtype), spec.dtype, spec.runtime)

    def step_seconds(self) -> float | None:
        return drafter_step_seconds(self.drafter)

    def run(self, job, gamma: int) -> None:
        from quickdraft.decoding.common import Generators

        prompt, sampling, max_new_tokens, seed = job
        gens = Generators.from_seed(seed)
        self.drafter.begin(prompt, max_new_tokens)
        first = int(_recv((1,), torch.long, TARGET)[0])
        if first < 0:
            return
        cfg = self.spec.pearl
        logic = PearlLogic(prompt + [first], gamma, cfg.pre_verify, cfg.post_verify, len(prompt) + max_new_tokens)
        while True:
            drafted, q = [], None
            job_d = logic.draft_job()
            if job_d is not None and job_d[1] > 0:  # exactly when the target's PearlDecoder asks
                draft = self.drafter.propose(job_d[0], DraftRequest.chain(job_d[1]), sampling, gens.draft)
                drafted, q = draft.tokens, draft.path_q()
                header = torch.tensor([len(drafted), int(q is not None), *drafted], dtype=torch.long)
                _send(torch.tensor([header.numel()]), TARGET)
                _send(header, TARGET)
                if q is not None:
                    _send(q.float(), TARGET)
            if logic.target_job() is None:
                logic.apply(None, drafted, q)
                continue
            n, nxt, done = _recv((3,), torch.long, TARGET).tolist()
            logic.apply(PearlVerdict(n, nxt), drafted, q)
            if done:
                return


class _TargetRole:
    def __init__(self, spec: ParallelSpec) -> None:
        from quickdraft.runtime.target import load_target
        from quickdraft.weights.loading import load_model

        self.spec = spec
        loaded = load_model(spec.target, spec.dtype)
        self.eos = set(loaded.eos_token_ids)
        self.target = load_target(loaded, spec.runtime, spec.quant).target

    def step_seconds(self) -> float:
        return step_seconds(self.target)

    def run(self, job, gamma: int, results, cancel) -> None:
        """The sequential driver's loop; each Round goes to the parent, each verdict to the draft.
        Ends at the token budget, an EOS, or the parent's cancel flag (stop strings, early close)."""
        from quickdraft.decoding.common import Generators
        from quickdraft.verifiers import make_verifier

        prompt, sampling, max_new_tokens, seed = job
        verifier = make_verifier(self.spec.verifier, sampling)
        decoder = PearlDecoder(self.target, RemoteDraft(self.target.vocab_size), verifier, self.spec.pearl, gamma)
        rounds = decoder.rounds(prompt, sampling, max_new_tokens, Generators.from_seed(seed))
        produced = 0
        try:
            for rnd in rounds:
                produced += len(rnd.tokens)
                done = produced >= max_new_tokens or bool(self.eos & set(rnd.tokens)) or cancel.is_set()
                results.put(("round", rnd))
                if decoder.last_verdict is None:  # the prefill round: the draft starts from its token
                    _send(torch.tensor([-1 if done else rnd.tokens[0]]), DRAFT)
                else:
                    v = decoder.last_verdict
                    _send(torch.tensor([v.num_accepted, v.next_token, int(done)]), DRAFT)
                if done:
                    break
        finally:
            rounds.close()
        results.put(("end",))
