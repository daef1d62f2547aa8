"""Kangaroo (arXiv 2404.18911): self-speculative drafting by double early exit.

The draft is the target's own first l layers (shared weights, shared KV cache) plus a trained
adapter (one attention block with its own norms) and the target's LM head (optionally restricted
to K ids). Drafting runs the shallow layers on each new token through a handle on them over the
target's own cache (`ShallowPass`, given by `bind`; never the target's cache owner) and stops after
the first draft token whose top-1 probability is below eta (the second early exit) or at the length
cap. The proposal carries the shallow states of [last committed token, d_1..d_k], so verification
runs only layers [l, L) (`forward(..., shallow=...)`).

State: `states` holds the exit-layer states of the committed tokens but the last (from `observe`,
len == len(context) - 1); the adapter's cache `kv` holds rows of committed tokens only: rows added
while drafting are dropped at the end of `propose` and refed from the verified states.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import Drafter, DraftRequest, draft_path, draft_token
from quickdraft.drafters.from_target.reuse import HeadLM, reusing_builder
from quickdraft.drafters.kinds import DrafterKind
from quickdraft.models.draft_heads import KangarooAdapter, block_cache
from quickdraft.verifiers.tree import TokenTree


class KangarooDrafter(Drafter):
    """Drafts with the target's shallow layers + a trained adapter (method sd; native runtime).

    Args:
        adapter: the trained adapter (its cfg.exit_layer is l).
        lm: the target's (restricted) LM head and embeddings.
        eta: stop after the first draft token whose top-1 draft probability is below eta.
    """

    def __init__(self, adapter: KangarooAdapter, lm: HeadLM, eta: float = 0.6, name: str = "kangaroo") -> None:
        self.adapter, self.lm, self.eta, self.name = adapter, lm, eta, name
        self.exit_layer = adapter.cfg.exit_layer
        self.target_layers = (self.exit_layer,)
        self.runs_target_layers = self.exit_layer
        self.shallow = None  # the handle on the target's layers [0, l) (`bind`)
        self.own = None  # a fork's private owner of those layers (`fork`)
        self.states: list[torch.Tensor] = []
        self.draft_steps = 0  # shallow passes + adapter steps since `begin` (the bench's cost model)
        self.kv = block_cache(adapter.cfg, lm.embed.dtype, lm.embed.device)

    def bind(self, shallow) -> None:
        """The handle on the target's first l layers (`ShallowPass`): they run on the target's cache."""
        self.shallow = shallow

    def begin(self, prompt_ids: Sequence[int], budget: int | None = None) -> None:
        self.states, self.draft_steps = [], 0
        self.kv.rollback(0)
        if self.own is not None:
            self.own.reset()

    def fork(self) -> KangarooDrafter | None:
        """A drafter for one row of a batch (None before `bind`). The batched target keeps no
        shallow keys per row and hands over no layer states, so the fork runs the target's first l
        layers over a private cache (`ShallowPass.detached`), the committed rows included: about l/L
        of a target forward per committed token, on top of the draft. It reads nothing from the
        target, and verification runs every layer (the batch reuses no shallow states)."""
        if self.shallow is None:
            return None
        twin = KangarooDrafter(self.adapter, self.lm, self.eta, self.name)
        twin.own = self.shallow.detached()
        twin.shallow = twin.own.shallow_pass(self.exit_layer)
        twin.target_layers, twin.runs_target_layers = (), 0
        return twin

    def _catch_up_own(self, context: Sequence[int]) -> None:
        """A fork's own layers [0, l) brought to the committed tokens (context but its last): the
        prefix they share is kept, the rest run; their exit-layer states are the adapter's input."""
        committed, own = len(context) - 1, self.own
        keep = own.shared_prefix(context)
        own.rollback(keep)
        del self.states[keep:]
        self.kv.rollback(min(self.kv.length, keep))
        if keep < committed:
            self.states.extend(own.extend_layers(context[keep:committed], self.exit_layer))

    def observe(self, states: dict[int, torch.Tensor]) -> None:
        self.states.extend(states[self.exit_layer])

    def step_seconds(self) -> float | None:
        """Measured seconds of one draft step (the target's first l layers on one token, the adapter
        and the LM head) on a short context; None before `bind`. Resets the target's cache: call
        between generations."""
        if self.shallow is None:
            return None
        import time

        kv, self.kv = self.kv, block_cache(self.adapter.cfg, self.lm.embed.dtype, self.lm.embed.device)
        self.shallow.prefill([0] * 16)
        with torch.inference_mode():
            self._adapt(self.shallow([1]))
            start = time.perf_counter()
            for _ in range(5):
                self._adapt(self.shallow([1]))
            seconds = (time.perf_counter() - start) / 5
        self.shallow.reset()
        self.kv = kv
        return seconds

    def _adapt(self, shallow: torch.Tensor, head: bool = True) -> torch.Tensor | None:
        """Rows (m, H) at the adapter cache's end -> (m, V) draft logits (None without `head`:
        committed rows are only cached)."""
        at = self.kv.length
        positions = torch.arange(at, at + shallow.shape[0], device=shallow.device)
        states = self.adapter(shallow[None], positions, self.kv)[0]
        return self.lm.logits(states) if head else None

    @torch.inference_mode()
    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """A chain that stops when the adapter's confidence drops below eta; it carries the shallow
        states of [last committed, tokens] for verification to reuse."""
        self.refuse_tree(request)
        committed = len(context) - 1
        if self.own is not None:
            self._catch_up_own(context)
        if self.shallow is None or len(self.states) != committed:
            raise RuntimeError(
                f"{self.name} drafter: not bound to the target, or {len(self.states)} exit-layer states for "
                f"{committed} cached tokens (a decoder must bind it and pass every forward's rows to observe)"
            )
        num_draft_tokens = min(request.budget, self.shallow.max_length - len(context) - 1)
        if num_draft_tokens < 1:
            return TokenTree()
        if self.kv.length < committed:  # committed rows the adapter has not read yet
            self._adapt(torch.stack(self.states[self.kv.length : committed]), head=False)
        shallow = [self.shallow([context[-1]])]  # first early exit
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        while True:
            logits = self._adapt(shallow[-1])[0]  # (V,)
            tokens.append(draft_token(logits, sampling, generator, q_rows))
            shallow.append(self.shallow(tokens[-1:]))  # verification reuses it
            self.draft_steps += 1
            confident = float(torch.softmax(logits.float(), -1).max()) >= self.eta  # second early exit
            if len(tokens) == num_draft_tokens or not confident:
                break
            if request.keep_drafting is not None and not request.keep_drafting(logits, len(tokens)):
                break
        self.kv.rollback(committed)
        return draft_path(tokens, q_rows, shallow=torch.cat(shallow))


def _from_module(module: KangarooAdapter, lm: HeadLM, eta: float, name: str) -> KangarooDrafter:
    return KangarooDrafter(module, lm, eta=eta, name=name)


KIND = DrafterKind(
    name="kangaroo",
    usage="kangaroo[:PATH]",
    summary="the target's first l layers and a Kangaroo adapter (native runtime)",
    build=reusing_builder(KangarooAdapter, _from_module),
    reads_target="layer l",
    module=KangarooAdapter,
    from_module=_from_module,
    decode_length=6,
    trained_by="train-draft",
    asset="kangaroo",
)
