"""A memory-mapped store of what the frozen target gives for a corpus: computed once, read every epoch.

Training a draft module (`train-draft`) needs, for every corpus window, the target's final-normed
features (the head's input and regression target; the target's p comes back from them through the
frozen LM head, one linear) and, for Kangaroo, the states entering its exit layer. The target's
forward costs far more than the module's step, so the store keeps those states on local disk:

    FOLDER/meta.json         what the store holds (target, window length, layers, corpus digest)
    FOLDER/ids.npy           (N,) int32 the windows' token ids, end to end
    FOLDER/rows.npy          (R, 3) int64 each window's start, length and prompt length
    FOLDER/features.bin      (N, H) bfloat16 (as int16) the final-normed features
    FOLDER/layer{l}.bin      (N, H) bfloat16 the states entering layer l (when asked for)
    FOLDER/built.npy         (R,) bool which windows are written

Windows are filled on demand, in whatever order training asks for them (the first pass over the
corpus computes, every later one reads); `flush` writes the data before the built flags, so a run
killed at any moment resumes with a consistent store (a window computed but not flagged is computed
again). The arrays are sparse files until written.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from quickdraft.errors import QuickdraftError

FEATURES = "features"


@dataclass
class Batch:
    """Padded target states of B corpus windows: ids (B, T); feats and shallow (B, T, H)."""

    ids: torch.Tensor
    lengths: list[int]
    prompt_lens: list[int]
    feats: torch.Tensor
    shallow: torch.Tensor | None


# (ids of one window) -> {FEATURES: (T, H), layer l: (T, H)} in bfloat16
ComputeStates = Callable[[list[int]], dict]
# (ids of several windows) -> one such dict per window (a GPU computes a chunk of windows at once)
ComputeMany = Callable[[list[list[int]]], list[dict]]


def windows_digest(windows: Sequence[tuple[list[int], int]]) -> str:
    """A short digest of the windows' ids and prompt lengths (a store belongs to one corpus)."""
    h = hashlib.sha1()
    for ids, prompt_len in windows:
        h.update(np.asarray([len(ids), prompt_len, *ids], dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


class FeatureStore:
    """The target's states over a list of windows (module docstring), opened or created at `folder`.

    Args:
        folder: the store's folder (created when absent).
        windows: (ids, prompt length) of every window, in the order indices refer to.
        hidden: the target's hidden size H.
        layer: the exit layer whose input states are kept too (Kangaroo), or None.
        meta: what the states come from (target name, dtype, ...): must match an existing store's.
    """

    def __init__(
        self, folder: Path, windows: Sequence[tuple[list[int], int]], hidden: int, layer: int | None, meta: dict
    ) -> None:
        self.folder = Path(folder)
        self.layer = layer
        self.hidden = hidden
        names = [FEATURES] + ([] if layer is None else [f"layer{layer}"])
        want = {**meta, "hidden": hidden, "arrays": names, "windows": len(windows), "digest": windows_digest(windows)}
        meta_path = self.folder / "meta.json"
        if meta_path.is_file():
            have = json.loads(meta_path.read_text())
            diff = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
            if diff:
                raise QuickdraftError(
                    f"feature store {self.folder} was built for other data ({', '.join(diff)} differ: "
                    f"{ {k: have.get(k) for k in diff} } != { {k: want.get(k) for k in diff} }); use another --store"
                )
        else:
            self._create(windows, want)
        self.ids = np.load(self.folder / "ids.npy", mmap_mode="r")
        self.rows = np.load(self.folder / "rows.npy")
        total = int(self.ids.shape[0])
        self.arrays = {
            name: np.memmap(self.folder / f"{name}.bin", dtype=np.int16, mode="r+", shape=(total, hidden))
            for name in names
        }
        self.built = np.load(self.folder / "built.npy")

    def _create(self, windows: Sequence[tuple[list[int], int]], meta: dict) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        lengths = np.asarray([len(ids) for ids, _ in windows], dtype=np.int64)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
        rows = np.stack([starts, lengths, np.asarray([p for _, p in windows], dtype=np.int64)], axis=1)
        ids = np.fromiter((t for w, _ in windows for t in w), dtype=np.int32, count=int(lengths.sum()))
        np.save(self.folder / "ids.npy", ids)
        np.save(self.folder / "rows.npy", rows)
        np.save(self.folder / "built.npy", np.zeros(len(windows), dtype=bool))
        for name in meta["arrays"]:  # sparse until written
            with open(self.folder / f"{name}.bin", "wb") as f:
                f.truncate(int(lengths.sum()) * self.hidden * 2)
        (self.folder / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")  # last: the store exists

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def coverage(self) -> float:
        """The fraction of windows written."""
        return float(self.built.mean()) if len(self.built) else 1.0

    def window(self, index: int) -> tuple[list[int], int]:
        start, length, prompt_len = (int(v) for v in self.rows[index])
        return self.ids[start : start + length].tolist(), prompt_len

    def fill(
        self, indices: Sequence[int], compute: ComputeStates, many: ComputeMany | None = None, chunk: int = 32
    ) -> int:
        """Compute and write the windows among `indices` not yet built, one at a time with `compute`
        or `chunk` at a time with `many`; returns how many."""
        todo = [int(i) for i in dict.fromkeys(indices) if not self.built[int(i)]]
        step = chunk if many is not None else 1
        for at in range(0, len(todo), step):
            part = todo[at : at + step]
            windows = [self.window(i)[0] for i in part]
            computed = many(windows) if many is not None else [compute(windows[0])]
            for i, states in zip(part, computed, strict=True):
                start, length = int(self.rows[i, 0]), int(self.rows[i, 1])
                for name, array in self.arrays.items():
                    key = FEATURES if name == FEATURES else self.layer
                    rows = states[key][:length].to(torch.bfloat16)
                    array[start : start + length] = rows.view(torch.int16).cpu().numpy()
                self.built[i] = True
        return len(todo)

    def flush(self) -> None:
        """Data first, then the flags that say it is there (atomically)."""
        for array in self.arrays.values():
            array.flush()
        tmp = self.folder / "built.tmp.npy"
        np.save(tmp, self.built)
        tmp.replace(self.folder / "built.npy")

    def batch(self, indices: Sequence[int]) -> Batch:
        """The built windows `indices` as one padded Batch (bfloat16 states)."""
        missing = [int(i) for i in indices if not self.built[int(i)]]
        if missing:
            raise QuickdraftError(f"feature store {self.folder}: windows {missing[:5]} are not built")
        spans = [(int(self.rows[i, 0]), int(self.rows[i, 1]), int(self.rows[i, 2])) for i in indices]
        width = max(n for _, n, _ in spans)
        ids = torch.zeros(len(spans), width, dtype=torch.long)
        out = {name: torch.zeros(len(spans), width, self.hidden, dtype=torch.bfloat16) for name in self.arrays}
        for b, (start, n, _) in enumerate(spans):
            ids[b, :n] = torch.from_numpy(self.ids[start : start + n].astype(np.int64))
            for name, array in self.arrays.items():
                out[name][b, :n] = torch.from_numpy(np.asarray(array[start : start + n])).view(torch.bfloat16)
        shallow = None if self.layer is None else out[f"layer{self.layer}"]
        return Batch(ids, [n for _, n, _ in spans], [p for _, _, p in spans], out[FEATURES], shallow)
