"""The host: its CPU (model name, flags) read once, the cache folder, measurements kept there, and the
median timer of what is measured on it.

On the ground floor (it imports nothing of quickdraft's), so the runtime's kernel choices
(`linear.packing`, the fused kernels' level and build key), the cost models above it and the weights'
conversions below it share one reader of /proc/cpuinfo, one cache folder and one timer.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def cache_dir() -> Path:
    """The quickdraft cache folder: `QUICKDRAFT_CACHE`, else ~/.cache/quickdraft."""
    return Path(os.environ.get("QUICKDRAFT_CACHE", Path.home() / ".cache" / "quickdraft"))


@functools.cache
def cpu_fields() -> dict[str, str]:
    """The first CPU's /proc/cpuinfo fields (model name, flags, ...), read once; {} where there is none."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


# macOS's sysctl names -> Linux's /proc/cpuinfo names, for the features the kernels' levels ask for
MAC_FEATURES = {
    "hw.optional.arm.FEAT_DotProd": "asimddp",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_FP16": "fphp",
}


def _sysctl(names: list[str]) -> dict[str, str]:
    """macOS's `sysctl` values of `names` that exist ({} elsewhere or on failure)."""
    try:
        run = subprocess.run(["sysctl", *names], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    return {k.strip(): v.strip() for k, sep, v in (line.partition(":") for line in run.stdout.splitlines()) if sep}


def features_of(fields: dict[str, str], sysctl: dict[str, str]) -> frozenset[str]:
    """A CPU's feature names as Linux spells them: /proc/cpuinfo's `flags` (x86) or `Features` (Arm), else
    macOS's sysctl (Arm: hw.optional.arm.FEAT_*; x86: machdep.cpu.*features, lower-cased)."""
    listed = fields.get("flags") or fields.get("Features")
    if listed:
        return frozenset(listed.split())
    names = {MAC_FEATURES[k] for k, v in sysctl.items() if k in MAC_FEATURES and v == "1"}
    for key in ("machdep.cpu.features", "machdep.cpu.leaf7_features"):
        names |= {f.lower().replace("avx512vnni", "avx512_vnni").replace("avx512bf16", "avx512_bf16")
                  for f in sysctl.get(key, "").split()}  # fmt: skip
    return frozenset(names)


@functools.cache
def cpu_features() -> frozenset[str]:
    """This CPU's features (`features_of`), read once: the kernels' levels and their build key use them."""
    mac = platform.system() == "Darwin"
    keys = [*MAC_FEATURES, "machdep.cpu.features", "machdep.cpu.leaf7_features"]
    return features_of(cpu_fields(), _sysctl(keys) if mac else {})


def available_memory() -> int | None:
    """Bytes of memory this host can give without swapping (Linux: /proc/meminfo's MemAvailable; macOS:
    free and inactive pages), or None where neither can be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    if platform.system() == "Darwin":
        try:
            text = subprocess.run(["vm_stat"], capture_output=True, text=True, timeout=10).stdout
            page = int(re.search(r"page size of (\d+)", text).group(1))
            pages = sum(int(re.search(rf"{k}:\s+(\d+)", text).group(1)) for k in ("Pages free", "Pages inactive"))
            return page * pages
        except (OSError, subprocess.SubprocessError, AttributeError, ValueError):
            return None
    return None


def native_bf16() -> bool:
    """Whether this CPU multiplies bfloat16 natively (AVX-512-BF16 or AMX): there bf16 autocast pays."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_features())


def machine_info(config_device: str = "cpu") -> dict:
    """What a measurement ran on: the CPU, its flags that pick kernels, torch's threads and version."""
    import torch

    wanted = {"avx2", "avx_vnni", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_vnni", "asimddp", "i8mm"}
    return {
        "cpu": cpu_model(),
        "cpu_flags": sorted(cpu_features() & wanted),
        "device": "cuda" if torch.cuda.is_available() and config_device == "cuda" else "cpu",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }


def cpu_model() -> str:
    mac = platform.system() == "Darwin"
    brand = _sysctl(["machdep.cpu.brand_string"]).get("machdep.cpu.brand_string") if mac else None
    return cpu_fields().get("model name") or brand or platform.processor() or platform.machine()


def median_seconds(fn: Callable[[], object], repeats: int = 30, warmup: int = 5) -> float:
    """Median wall seconds of `fn()` over `repeats` calls after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@contextlib.contextmanager
def folder_in_place(target: Path):
    """Yield a fresh folder beside `target` to fill; on success it replaces `target` whole (renamed into
    place), on failure it is removed: a folder at `target` is always a complete one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        yield tmp
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def release_free_memory() -> None:
    """Hand the allocator's free pages back to the system (glibc's malloc_trim), where there is one:
    after a build that made and dropped large temporaries (a GGUF's dequantized tensors)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(name).malloc_trim(0)


def safe_name(raw: str) -> str:
    """`raw` as a file name: runs of anything but letters, digits, `_`, `.` and `-` become `_`."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)


def kept(path: Path, measure: Callable[[], object], encode=lambda value: value, decode=lambda raw: raw):
    """A measurement kept in a json file: read back (`decode(raw)`, which raises ValueError, KeyError
    or TypeError on a value it rejects), else `measure()`d and written (not kept where the folder
    cannot be written: measured again next time)."""
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return decode(json.loads(path.read_text()))
    value = measure()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.partial")  # written whole, then renamed: a reader
        tmp.write_text(json.dumps(encode(value)) + "\n")  # never sees half a file
        os.replace(tmp, path)
    return value
