"""Drafting with a model that owns its own cache, and the kinds built on it: an independent draft model
(`model:PATH|NAME[;quant=MODE][;vocab=K][;window=N]`, any causal LM sharing the target's vocabulary: a folder,
a GGUF file or a named model such as `qwen2.5-coder-0.5b`, in its fast form by default: `fast_form.py`), and the
target's own weights quantized (`quant[:w4a8|int4[:G]|int8|w8a8|gguf]`);
a DistillSpec delta (`distilled[:PATH]`) is in `drafters/draft_models/distilled.py`.

Drafting calls the model's forward directly through a CachedModel, one token per step with the LM
head on the last position only; `transformers.generate()` is avoided because its per-call set-up
dominates a small model's step on CPU.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path

import torch

from quickdraft.config import SamplingConfig
from quickdraft.drafters.base import Drafter, DraftRequest, draft_path, draft_token
from quickdraft.drafters.draft_models.fast_form import DraftForm, fast_form, resolve
from quickdraft.drafters.draft_models.vocab import ALL, restricted_head, split_options, split_vocab
from quickdraft.drafters.draft_models.window import ContextWindow, parse_window, readable
from quickdraft.drafters.kinds import DrafterKind, DrafterSpec
from quickdraft.drafters.tree import model_tree
from quickdraft.errors import QuickdraftError
from quickdraft.runtime import kernels
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.runtime.choose import cached_model, forces_reference
from quickdraft.runtime.quant.modes import QuantSpec, check_dtype, parse_quantize
from quickdraft.verifiers.tree import TokenTree
from quickdraft.weights.loading import LoadedModel, check_vocab, draft_head, embedding_rows, load_model, resolve_dtype


def parse_quant(arg: str | None):
    """`quant[:MODE[;vocab=K]]` -> (QuantSpec, K or None): the target's own weights quantized (MODE as
    `--quantize`, default w4a8: the cheapest step measured, docs/bench/draft-costs), its head restricted
    to K ids (drafters/draft_models/vocab.py)."""

    mode, vocab = split_vocab("quant", arg)
    spec = parse_quantize(mode or "w4a8")
    if not spec.active:
        raise QuickdraftError("drafter 'quant:none' would be the target itself: choose w4a8, int4, int8, w8a8 or gguf")
    return spec, vocab


class ModelDrafter(Drafter):
    """Autoregressive drafting with a small model that owns its own KV cache.

    Cache ownership: this object's CachedModel. At each `propose` the cache is synced to the
    committed context (rejected drafts dropped, unfed tokens such as the last accepted draft and the
    bonus token fed), then k tokens are drafted; the last drafted token is never fed. The context it
    reads is `window`'s view of it (default: all of it).
    """

    drafts_trees = True
    can_review = True

    def __init__(
        self, model: CachedModel, name: str = "model", weights=None, window: int | None = None, rows: int | None = None
    ) -> None:
        self.model = model
        self.name = name
        self.window = ContextWindow(window)  # `window.fitted`: its size fitted to each generation's budget
        self.weights = weights  # the quantized forms `model` runs: held, so other drafters reuse them (shared)
        self.rows = rows  # its embedding's rows where the target's vocabulary is wider (`window.readable`)
        self._forwards_at_begin = 0

    def begin(self, prompt_ids: Sequence[int], budget: int | None = None) -> None:
        self.model.reset()
        self.window.begin(prompt_ids, budget)
        self._forwards_at_begin = self.model.num_forwards

    @property
    def draft_steps(self) -> int:
        """Draft-model forwards since `begin` (the bench's cost model)."""
        return self.model.num_forwards - self._forwards_at_begin

    def kv_bytes(self) -> int:
        return self.model.kv_bytes

    def fork(self) -> ModelDrafter:
        """A drafter for one more sequence of a batch: the same model, its own cache."""
        twin = ModelDrafter(self.model.twin(), self.name, self.weights, self.window.size)
        twin.window.fitted, twin.pmin, twin.rows = self.window.fitted, self.pmin, self.rows
        return twin

    def step_seconds(self) -> float:
        """Measured seconds of one draft step (a single-token cached forward); resets the cache."""
        from quickdraft.costs.timing import step_seconds

        return step_seconds(self.model)

    def propose(
        self, context: Sequence[int], request: DraftRequest, sampling: SamplingConfig, generator: torch.Generator | None
    ) -> TokenTree:
        """A chain of one token per step, or a token tree (drafters/tree.py); the cache ends at `context`.
        A draft with a shorter context than the target stops drafting near its limit (plain steps)."""
        context = readable(self.window.view(context), self.rows)
        if request.shape is not None:
            request = request.within(self.model.max_length - len(context) - 1)
            if request.budget < 1:
                return TokenTree()
            return model_tree(self.model, context, request.shape, sampling, generator)
        k = min(request.budget, self.model.max_length - len(context))
        if k < 1:
            return TokenTree()
        logits = self.model.sync(context)[-1]  # (V,)
        tokens: list[int] = []
        q_rows: list[torch.Tensor] = []
        keep = request.keep_drafting
        siblings = request.siblings if sampling.greedy else None
        beside: list[tuple[int, int]] = []  # (chain position, the second choice there)
        while True:
            token = draft_token(logits, sampling, generator, q_rows)
            tokens.append(token)
            if siblings is not None:
                second = second_choice(logits, token)
                if siblings(second[1], second[2], len(tokens), 1 + len(tokens) + len(beside)):
                    beside.append((len(tokens), second[0]))
            if len(tokens) == k or (keep is not None and not keep(logits, len(tokens))):
                break
            logits = self.model.extend([token], last_only=True)[-1]
        return with_siblings(tokens, beside) if beside else draft_path(tokens, q_rows)

    @torch.inference_mode()
    def review(self, context: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """One forward over proposed `tokens` after `context` (CS Drafting's review): (m+1, V) logits
        of this model at the positions predicting tokens[0..m-1] and the one after them."""
        context = self.window.view(context)
        self.model.rollback(min(self.model.length, len(context) - 1))  # so the rows below are all fed
        return self.model.sync(list(context) + list(tokens), last_only=False)[-(len(tokens) + 1) :]


def second_choice(logits: torch.Tensor, token: int) -> tuple[int, float, float]:
    """(the draft's most probable id other than `token`, the draft probability of `token`, that of the
    other) from a (V,) logits row."""
    probs = torch.softmax(logits.float(), -1)
    top = torch.topk(probs, 2)
    ids, values = top.indices.tolist(), top.values.tolist()
    other = 1 if ids[0] == token else 0
    return ids[other], float(probs[token]), values[other]


def with_siblings(tokens: Sequence[int], beside: Sequence[tuple[int, int]]) -> TokenTree:
    """A greedy chain with leaves beside it: `beside` (position, id) puts id beside the chain's token at
    that 1-based position (same parent). Parents come before children; the chain keeps its order."""
    tree, parent, at = TokenTree(), -1, dict(beside)
    for position, token in enumerate(tokens, start=1):
        node = tree.add(token, parent)
        if position in at:
            tree.add(at[position], parent)
        parent = node
    return tree


def model_drafter(
    draft: LoadedModel, target: LoadedModel, name: str, runtime: str, window: int | None = None
) -> ModelDrafter:
    """A ModelDrafter over `draft` (its vocabulary checked against the target's), on the target's device,
    reading `window`'s view of the context (None: all of it)."""
    vocab = check_vocab(target, draft)
    draft.model.to(target.model.device)
    model = cached_model(draft.model, vocab, draft_head(draft, vocab), runtime)
    return ModelDrafter(model, name=name, window=window, rows=embedding_rows(draft, vocab))


def own_dtype(dtype: str, target: LoadedModel) -> torch.dtype:
    """The torch dtype a copied draft runs in: the one asked for, else the target's."""
    return resolve_dtype(dtype) if dtype else target.model.dtype


MODEL_OPTIONS = ("quant", "vocab", "window")


UNSET = "unset"  # an option left open: the fast form decides (drafters/draft_models/fast_form.py)


def parse_model(arg: str | None) -> tuple[str, DraftForm]:
    """`model:PATH|NAME[;quant=MODE][;vocab=K|PATH|all][;window=N|all]` -> (path or name, the options
    given, each UNSET where left open: the draft's fast form fills those when it loads). MODE is
    `--quantize`'s (none, w4a8, w4a8-all, ...); N: the prompt tokens the draft reads (`window.py`)."""

    path, options = split_options("model", arg, MODEL_OPTIONS)
    if not path:
        raise QuickdraftError("drafter 'model' needs a path or a model name: model:PATH")
    quant = options.get("quant", UNSET)  # parsed here, once (a bad mode refused at the edge, the modes named)
    vocab = options.get("vocab", UNSET)
    window = options.get("window", UNSET)
    window = window if window == UNSET else None if window == ALL else parse_window(window, f"drafter 'model:{arg}'")
    return path, DraftForm(quant if quant == UNSET else parse_quantize(quant), None if vocab == ALL else vocab, window)


_DRAFTS: dict[tuple[str, str], tuple] = {}  # (path, dtype) -> (weakref to the model, the LoadedModel's other fields)


def shared_draft(path: str, dtype: str) -> LoadedModel:
    """The draft model at `path` in `dtype`, loaded once while anything still holds it (the bench's
    methods drafting with one model share its weights and their quantized forms)."""
    import dataclasses
    import weakref

    held = _DRAFTS.get((path, dtype))
    model = held[0]() if held is not None else None
    if model is not None:
        return LoadedModel(model, **held[1])
    draft = load_model(path, dtype)
    rest = {f.name: getattr(draft, f.name) for f in dataclasses.fields(draft) if f.name not in ("model", "head_ids")}
    _DRAFTS[(path, dtype)] = (weakref.ref(draft.model), rest)
    return draft


# an independent draft model's default chain: up to 8 tokens, stopped after one it gives p < 0.7 (the
# fastest of the stops measured on the Qwen pair: docs/benchmarks.md)
PMIN = (8, 0.7)


def _model(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> ModelDrafter:
    """An independent draft model; quantized (its GGUF's own blocks under w4a8) on the native runtime."""
    path, given = spec.value
    draft = shared_draft(path, dtype)
    form = resolve(given, fast_form(draft.model, target.vocab_size, runtime, target.model.device.type), UNSET)
    draft.head_ids = restricted_head(target, form.vocab)
    drafter = native_drafter(draft, target, str(spec), runtime, form.quant, form.window)
    drafter.window.fitted = given.window is UNSET  # the fast form's window, fitted to each generation's budget
    drafter.pmin = PMIN
    return drafter


def native_drafter(
    draft: LoadedModel, target: LoadedModel, name: str, runtime: str, quant=None, window: int | None = None
) -> ModelDrafter:
    """A draft model's drafter in `quant` (a QuantSpec; None: w4a8 for a GGUF-born draft where the fused
    kernels run, its own blocks where a delta did not retrain them, else none), native when quantized."""
    from quickdraft.runtime.quant.quantized import quantize_model

    as_stored = draft.gguf is not None and not forces_reference(runtime) and kernels.fused_ops() is not None
    mode = quant or QuantSpec("w4a8" if as_stored else "none")
    if not mode.active:
        return model_drafter(draft, target, name, runtime, window)
    if forces_reference(runtime):
        raise QuickdraftError(f"drafter {name}: a quantized draft needs the native runtime (not --runtime hf)")
    check_dtype(draft.model.dtype, f"drafter {name}")
    vocab_size = check_vocab(target, draft)
    quantized = quantize_model(draft, mode)  # one copy while a drafter holds it: the bench's methods share it
    model = cached_model(draft.model, vocab_size, draft_head(draft, vocab_size), "native", quantized.linears)
    return ModelDrafter(model, name=name, weights=quantized, window=window, rows=embedding_rows(draft, vocab_size))


def _quant(spec: DrafterSpec, target: LoadedModel, dtype: str, runtime: str) -> ModelDrafter:
    """The target's own weights quantized (w4a8 by default), run natively with its own cache; in the
    target's dtype, float32 under a float64 target (the kernels take no float64), or "@DTYPE"."""
    from quickdraft.runtime.quant.quantized import quantize_model

    if forces_reference(runtime):
        raise QuickdraftError(f"drafter {spec}: quantized drafts need the native runtime (not --runtime hf)")
    own = own_dtype(dtype, target)
    own = torch.float32 if own == torch.float64 and not spec.dtype else own
    check_dtype(own, f"drafter {spec}")
    model = target.model if own == target.model.dtype else copy.deepcopy(target.model).to(own)
    mode, vocab = spec.value
    quantized = quantize_model(target, mode, own)
    head = restricted_head(target, vocab)
    return ModelDrafter(cached_model(model, target.vocab_size, head, "native", quantized.linears), str(spec), quantized)


def _export_model(spec: DrafterSpec, num_draft_tokens: int, draft_dir: str | None) -> dict:
    return {
        "method": "draft_model",
        "model": str(Path(spec.value[0]).expanduser().resolve()),
        "num_speculative_tokens": num_draft_tokens,
    }


MODEL = DrafterKind(
    name="model",
    usage="model:PATH|NAME[;quant=MODE][;vocab=K|all][;window=N|all]",
    summary="an independent draft model sharing the target's vocabulary (a folder, a GGUF file or a named "
    "one, e.g. qwen2.5-coder-0.5b), in its fast form unless an option says otherwise: w4a8-all, a head of the "
    "32k most frequent ids, a prompt window of 256 tokens fitted to the generation's budget",
    build=_model,
    parse_arg=parse_model,
    takes_dtype=True,
    drafts_trees=True,
    can_review=True,
    hf_model=True,
    export=_export_model,
)
QUANT = DrafterKind(
    name="quant",
    usage="quant[:w4a8|int4[:G]|int8|w8a8|gguf[;vocab=K]]",
    summary="the target's own weights quantized, a self-draft with its own cache (;vocab=K: a K-id head)",
    build=_quant,
    parse_arg=parse_quant,
    drafts_trees=True,
    can_review=True,
)
