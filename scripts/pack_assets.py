"""Store trained draft weights packed (int8 rows or int4 groups; weights/weight_files.py), in place.

    python scripts/pack_assets.py --bits 8 src/quickdraft/assets/head/smollm2-135m-instruct/draft_head.safetensors

Loaders read packed and unpacked files alike. Re-measure the drafter's acceptance after packing
(docs/benchmarks.md, "Shipped drafts stored packed").
"""

from __future__ import annotations

import argparse
from pathlib import Path

from quickdraft.weights import weight_files


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--bits", type=int, choices=(4, 8), required=True)
    ap.add_argument("--group", type=int, default=32, help="int4: inputs per group")
    args = ap.parse_args()
    for path in args.files:
        before = path.stat().st_size
        tensors = weight_files.read(path)  # a packed file is unpacked first: packing again re-rounds
        weight_files.write(path, tensors, args.bits, args.group)
        print(f"{path}: {before / 1e6:.1f} MB -> {path.stat().st_size / 1e6:.1f} MB ({args.bits}-bit)")


if __name__ == "__main__":
    main()
