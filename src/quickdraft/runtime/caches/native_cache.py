"""NativeCachedModel: the one owner of a native Llama forward and its static KV cache.

The same verbs as `CachedModel` (prefill and sync shared with it; extend, rollback, reset; logits cut to the shared
vocabulary, an optional restricted LM head), so decoders and drafters use either unchanged, plus
what speculation beyond chains needs: `extend` takes positions and a tree mask over the new rows and
can return hidden states; `compact` keeps a chosen subset of the rows just added (the accepted path
of a tree); rollback only sets a length (no copy, no reallocation).

Self-drafting that shares this cache (Kangaroo) runs the first l layers on draft tokens with
`extend_shallow` (their layer-[0, l) keys land in this cache, ahead of the committed length), then
verification passes those states back to `extend(..., shallow=...)`, which runs only layers [l, L).
`forward` returns one record (`types.TargetOutput`: logits, the hidden states asked for and the
final-normed features the LM head reads); `extend` is its logits. The owner keeps only the cache and
the ids it holds.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence

import torch

from quickdraft.runtime.caches.cached_model import TokenCacheVerbs, check_head_ids, scatter_head
from quickdraft.runtime.forward.native import NativeLlama
from quickdraft.runtime.kernels.linear import Linear
from quickdraft.types import TargetOutput

PREFILL_CHUNK = 2048  # rows of a long causal run (a prompt's prefill) per forward: its mask is chunk x context


class ShallowPass:
    """A handle on the target's first `stop` layers over the target's own cache, the one thing a
    self-drafting drafter (Kangaroo) is given of the target (not its cache owner): `__call__` runs
    tokens that follow the committed ones (and earlier shallow tokens) through those layers, caching
    their shallow keys, and returns (n, H) states that verification finishes
    (`forward(..., shallow=...)`); `prefill` and `reset` serve measuring a draft step between
    generations."""

    def __init__(self, owner: NativeCachedModel, stop: int) -> None:
        if not 0 < stop < owner.net.num_layers:
            raise ValueError(f"shallow pass: exit layer {stop} outside [1, {owner.net.num_layers - 1}]")
        self._owner, self.stop = owner, stop

    def __call__(self, tokens: Sequence[int]) -> torch.Tensor:
        return self._owner.extend_shallow(tokens, self.stop)

    @property
    def max_length(self) -> int:
        return self._owner.max_length

    def prefill(self, tokens: Sequence[int]) -> None:
        self._owner.prefill(tokens)

    def detached(self) -> NativeCachedModel:
        """A private owner of the same layers with its own empty cache (`NativeCachedModel.twin`): a
        drafter forked for one row of a batch runs its shallow passes there, not in the target's cache."""
        return self._owner.twin()

    def reset(self) -> None:
        self._owner.reset()


class NativeCachedModel(TokenCacheVerbs):
    """One Llama-family model run natively, with its static cache: the `native` implementation of
    `models.target.Target` (trees, states, shallow passes, batches).

    Args:
        model: a Hugging Face LlamaForCausalLM (its weights are read in place).
        vocab_size: logits are cut to this many columns.
        head_ids: (K,) token ids the LM head is restricted to (q = 0 elsewhere); None = all.
    """

    runtime = "native"
    supports_trees = True
    reads_states = True
    # runtime/caches/batched.py (BatchedTarget) runs several sequences over its forward, every described block
    # (sliding windows narrow the batch's mask per layer; capped scores take the explicit product)
    supports_batches = True

    def __init__(
        self,
        model,
        vocab_size: int | None = None,
        head_ids: torch.Tensor | None = None,
        linears: Mapping[str, Callable] | None = None,
    ) -> None:
        self.model = model.eval()
        self.net = NativeLlama(model, linears)
        self.vocab_size = vocab_size or int(model.config.vocab_size)
        self.cache = self.net.new_cache()
        self.tokens: list[int] = []
        self.num_forwards = 0
        self._shallow: list[int] = []  # tokens run through layers [0, l) beyond the committed length
        self._shallow_stop = 0
        self._block_start = 0  # where the last extend's rows begin (for compact)
        self.head_ids = None if head_ids is None else check_head_ids(head_ids, self.vocab_size)
        quantized = self.net.head_linear  # a kernel-form head (rows are independent: cut exactly)
        if quantized is None:  # the float head: its kept rows (a copy only where restricted), packed where it pays
            rows = self.net.head[: self.vocab_size] if self.head_ids is None else self.net.head[self.head_ids]
            self.head_linear = Linear(rows.contiguous(), self.net.packed)
        elif self.head_ids is not None:
            self.head_linear = quantized.rows(self.head_ids)
        elif quantized.out_features != self.vocab_size:
            self.head_linear = quantized.rows(torch.arange(self.vocab_size))  # drops a padded tail
        else:
            self.head_linear = quantized

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def max_length(self) -> int:
        return self.net.max_length

    def twin(self) -> NativeCachedModel:
        """A second owner of this model: the same weights, kernels and LM head, its own empty cache
        (a drafter forked for one more sequence of a batch drafts there)."""
        twin = copy.copy(self)
        twin.cache, twin.tokens, twin.num_forwards = self.net.new_cache(), [], 0
        twin._shallow, twin._block_start = [], 0
        return twin

    def reset(self) -> None:
        self.tokens = []
        self._shallow = []
        self.cache.length = 0

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, H) final-normed states -> (n, V) logits (-inf off a restricted head's ids)."""
        sub = self.head_linear(hidden)
        cap = self.net.final_softcap
        if cap:
            sub = torch.tanh(sub / cap) * cap
        return sub if self.head_ids is None else scatter_head(sub, self.head_ids, self.vocab_size)

    def extend(
        self,
        tokens: Sequence[int],
        last_only: bool = False,
        positions: Sequence[int] | None = None,
        tree_mask: torch.Tensor | None = None,
        shallow: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Append tokens to the cache and return their logits ((n, V), or (1, V) with last_only):
        `forward`'s logits."""
        return self.forward(tokens, last_only, positions, tree_mask, shallow=shallow).logits

    @torch.inference_mode()
    def forward(
        self,
        tokens: Sequence[int],
        last_only: bool = False,
        positions: Sequence[int] | None = None,
        tree_mask: torch.Tensor | None = None,
        keep_hidden: Sequence[int] = (),
        shallow: torch.Tensor | None = None,
        features: bool = False,
    ) -> TargetOutput:
        """Append tokens to the cache and return their logits and the states asked for.

        Args:
            tokens: n >= 1 new token ids following the cached ones.
            last_only: the LM head on the last row only.
            positions: (n,) RoPE positions (default: consecutive after the cache).
            tree_mask: (n, n) bool, which new rows each new row attends to (default causal).
            keep_hidden: layers whose entering states to return ((n, H) each).
            shallow: (n, H) the states after layers [0, l) of exactly these tokens, computed by
                `extend_shallow` (their shallow keys are cached): only layers [l, L) run.
            features: return the rows' final-normed states (n, H) too.

        Returns:
            TargetOutput: (n, V) logits, or (1, V) with last_only, in the model's dtype.
        """
        n, at = len(tokens), self.length
        self.cache.ensure(at + n)
        pos = None if positions is None else torch.tensor(list(positions), dtype=torch.long, device=self.net.device)
        if shallow is not None:
            if list(tokens) != self._shallow or shallow.shape[0] != n:
                raise ValueError("extend(shallow=...): the tokens are not the ones run by extend_shallow")
            stop = self._shallow_stop
            x, kept = self.net.forward(
                self.cache, at, hidden=shallow, positions=pos, tree_mask=tree_mask,
                layers=(stop, self.net.num_layers), keep_hidden=keep_hidden,
            )  # fmt: skip
        else:
            ids = torch.tensor(list(tokens), dtype=torch.long, device=self.net.device)
            x, kept = self._forward_ids(at, ids, pos, tree_mask, keep_hidden)
        self._shallow = []
        self._block_start = at
        self.num_forwards += 1
        self.tokens.extend(int(t) for t in tokens)
        self.cache.length = self.length
        return TargetOutput(self.logits(x[-1:] if last_only else x), kept, x if features else None)

    def _forward_ids(self, at: int, ids: torch.Tensor, pos, tree_mask, keep_hidden) -> tuple[torch.Tensor, dict]:
        """`net.forward` over new ids; a long causal run (a prompt's prefill) in chunks of PREFILL_CHUNK
        rows, each over the context before it, so no mask is wider than a chunk's rows (a whole 31k-token
        prompt's would be 31k x 31k); each row attends to the same keys either way."""
        n = ids.shape[0]
        if tree_mask is not None or pos is not None or n <= PREFILL_CHUNK:
            return self.net.forward(self.cache, at, ids, positions=pos, tree_mask=tree_mask, keep_hidden=keep_hidden)
        parts, kept_parts = [], []
        for i in range(0, n, PREFILL_CHUNK):
            x, kept = self.net.forward(self.cache, at + i, ids[i : i + PREFILL_CHUNK], keep_hidden=keep_hidden)
            parts.append(x)
            kept_parts.append(kept)
        return torch.cat(parts), {k: torch.cat([kp[k] for kp in kept_parts]) for k in kept_parts[0]}

    def shallow_pass(self, stop: int) -> ShallowPass:
        """The handle a self-drafting drafter gets: layers [0, stop) over this cache."""
        return ShallowPass(self, stop)

    @torch.inference_mode()
    def extend_shallow(self, tokens: Sequence[int], stop: int) -> torch.Tensor:
        """Run layers [0, stop) on tokens that follow the committed ones and any earlier shallow
        tokens; their keys for those layers are cached. Returns (n, H), the states entering layer
        `stop`. The committed length does not move: `extend(..., shallow=...)` finishes them and
        rollback, reset or a plain extend drops them."""
        if self._shallow and stop != self._shallow_stop:
            raise ValueError(f"extend_shallow: exit layer {stop} differs from the pending {self._shallow_stop}")
        if not 0 < stop < self.net.num_layers:
            raise ValueError(f"extend_shallow: exit layer {stop} outside [1, {self.net.num_layers - 1}]")
        at = self.length + len(self._shallow)
        self.cache.ensure(at + len(tokens))
        ids = torch.tensor(list(tokens), dtype=torch.long, device=self.net.device)
        x, _ = self.net.forward(self.cache, at, ids, layers=(0, stop))
        self._shallow.extend(int(t) for t in tokens)
        self._shallow_stop = stop
        self.cache.length = at + len(tokens)
        return x

    def extend_layers(self, tokens: Sequence[int], stop: int) -> torch.Tensor:
        """Append tokens as committed rows through layers [0, stop) only (a private copy of the
        target's first layers, as a forked Kangaroo keeps: its deeper layers' keys are never read);
        returns (n, H), the states entering layer `stop`."""
        if self._shallow:
            raise ValueError("extend_layers: shallow draft rows are pending (roll back first)")
        states = self.extend_shallow(tokens, stop)
        self.tokens.extend(self._shallow)
        self._shallow = []
        return states

    @torch.inference_mode()
    def restore(self, tokens: Sequence[int], k: torch.Tensor, v: torch.Tensor) -> None:
        """Hold `tokens` with their (layers, kv, n, d) keys and values (a kept prefix: prefix_store.py)."""
        n = len(tokens)
        self.reset()
        self.cache.ensure(n)
        self.cache.k[:, :, :n], self.cache.v[:, :, :n] = k, v
        self.tokens, self.cache.length = list(tokens), n

    def rollback(self, length: int) -> None:
        """Drop every cached position from `length` on: a new length, nothing copied."""
        if not 0 <= length <= self.length:
            raise ValueError(f"rollback to {length} outside [0, {self.length}]")
        del self.tokens[length:]
        self._shallow = []
        self.cache.rollback(length)

    @torch.inference_mode()
    def compact(self, keep: Sequence[int]) -> None:
        """Keep only rows `keep` (indices into the last extend's rows, increasing) of the last
        extend, moved to follow the context in that order: the accepted path of a tree."""
        start = self._block_start
        rows = [start + int(i) for i in keep]
        if any(r >= self.length or r < start for r in rows) or rows != sorted(set(rows)):
            raise ValueError(f"compact: rows {list(keep)} are not increasing rows of the last extend")
        self.cache.keep(torch.tensor(rows, dtype=torch.long, device=self.net.device), start)
        self.tokens[start:] = [self.tokens[r] for r in rows]
