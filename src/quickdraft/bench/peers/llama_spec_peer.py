"""llama.cpp's own draft-model speculation as a bench peer: what a CPU user would pick instead of us
(`llama-cpp:draft=NAME|PATH`, issue #49).

llama-cpp-python has no draft-model API, so this builds llama.cpp's `llama-speculative-simple` (the
target and a draft model, greedy, one sequence: the loop of `llama-server --model-draft`) once, from
the source vendored in the installed llama-cpp-python's sdist (fetched from the package registry),
with the flags of `bench/peers/llama_cmake.py` (this CPU's sets, AMX off), into the quickdraft cache.

Each prompt is one run of that binary on the same prompt text (our tokenizer's decoding of the
prompt ids, special tokens kept; llama.cpp tokenizes it again). Its time is what llama.cpp itself
reports, prompt encoding plus decoding (the model load is not timed, as ours is not); its tokens are
its printed text tokenized by our tokenizer. A round can run past the token budget (its last verify
accepts a whole draft): the tokens past it are dropped and its time prorated to the tokens kept.
`draft_max`, `draft_min` and `p_min` pass to its `--spec-draft-n-max`, `--spec-draft-n-min` and
`--spec-draft-p-min` (its defaults when absent: 3, 0 and 0.0 in 0.3.36's llama.cpp).
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from quickdraft.bench.outputs import RunOutput
from quickdraft.bench.peers.child import CHILD_PEAKS, PeerCrashed, describe_exit, peak_rss_kib
from quickdraft.bench.peers.llama_cmake import cmake_args, host_flags
from quickdraft.bench.peers.llama_cpp_peer import quantized_copy
from quickdraft.errors import QuickdraftError
from quickdraft.host import cache_dir

BINARY = "llama-speculative-simple"
SPEC_KEYS = ("draft", "draft_max", "draft_min", "p_min")
_FLAGS = {"draft_max": "--spec-draft-n-max", "draft_min": "--spec-draft-n-min", "p_min": "--spec-draft-p-min"}


def build_args(flags: set[str]) -> list[str]:
    """CMake arguments for the speculative binary: the peer's own flags, examples on, one static binary."""
    args = [a for a in cmake_args(flags) if not a.startswith("-DLLAMA_BUILD_EXAMPLES=")]
    return args + [
        "-DLLAMA_BUILD_EXAMPLES=ON",
        "-DBUILD_SHARED_LIBS=OFF",
        "-DLLAMA_CURL=OFF",
        "-DCMAKE_BUILD_TYPE=Release",
    ]


def binary_path(version: str, flags: set[str]) -> Path:
    """Where the binary for this llama-cpp-python version and these build flags lives in the cache."""
    key = "-".join(
        a.split("=")[0].removeprefix("-DGGML_").lower() for a in cmake_args(flags) if a.endswith("=ON") and "GGML_" in a
    )
    return cache_dir() / "llama_cpp" / f"speculative-{version}-{key or 'scalar'}" / BINARY


def _say(line: str) -> None:
    print(f"[llama.cpp speculative build] {line}", file=sys.stderr, flush=True)


def _run(cmd: list[str], cwd: Path, log: Path) -> None:
    """Run a build step, its output to `log` with cmake's "[ NN%]" progress shown; a failure raises
    with the compiler's own error line."""
    with log.open("a") as out:
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        shown = -1
        for line in proc.stdout:
            out.write(line)
            step = re.match(r"\[\s*(\d+)%\]", line)
            if step and int(step.group(1)) // 10 > shown:  # each tenth passed, once
                shown = int(step.group(1)) // 10
                _say(f"{step.group(1)}%")
        code = proc.wait()
    if code != 0:
        lines = log.read_text().splitlines()
        errors = [ln.strip() for ln in lines if "error:" in ln.lower()] or [
            ln.strip() for ln in lines if "error" in ln.lower()
        ]
        raise QuickdraftError(f"building {BINARY} failed: {errors[0] if errors else cmd[0] + ' exited ' + str(code)}")


def speculative_binary() -> Path:
    """The built binary, building it once (about 6 min on 2 cores) when the cache lacks it."""
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        raise QuickdraftError('llama-cpp:draft needs llama-cpp-python: pip install -e ".[peers]"') from None
    flags = host_flags()
    out = binary_path(version, flags)
    if out.exists():
        return out
    if shutil.which("cmake") is None:
        raise QuickdraftError(f"building {BINARY} needs cmake on PATH (pip install cmake)")
    out.parent.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent.parent) as tmp:
        work = Path(tmp)
        _say(f"fetching llama-cpp-python {version}'s sdist, building {BINARY} (about 6 min on 2 cores)")
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:", "-d", str(work),
             f"llama-cpp-python=={version}"],
            capture_output=True, text=True,
        )  # fmt: skip
        if fetched.returncode != 0:
            last = (fetched.stderr.strip().splitlines() or ["pip exited " + str(fetched.returncode)])[-1]
            raise QuickdraftError(f"fetching llama-cpp-python {version}'s sdist failed: {last}")
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(sdist) as tar:
            tar.extractall(work, filter="data")
        source = next(work.glob("llama_cpp_python-*/vendor/llama.cpp"))
        log = work / "build.log"
        _run(["cmake", "-S", str(source), "-B", str(work / "build"), *build_args(flags)], work, log)
        jobs = str(os.cpu_count() or 2)
        _run(["cmake", "--build", str(work / "build"), "--target", BINARY, "-j", jobs], work, log)
        built = next((work / "build").rglob(BINARY))
        staged = work / "out"
        staged.mkdir()
        shutil.copy2(built, staged / BINARY)
        shutil.copy2(log, staged / "build.log")
        (staged / "cmake_args.txt").write_text(" ".join(build_args(flags)) + "\n")
        staged.rename(out.parent)  # atomic: the folder appears whole or not at all
    _say(f"built {out}")
    return out


@dataclass
class SpecRun:
    """What one run of the binary reported."""

    text: str  # the generated text (the prompt's echo removed)
    tokens: int  # n_predict: tokens generated
    seconds: float  # prompt encoding plus decoding, as llama.cpp timed them
    drafted: int
    accepted: int


def parse_run(stdout: str, stderr: str, prompt_text: str) -> SpecRun:
    """Read a run's printed text (stdout: two newlines, the prompt, the generated text, then two
    newlines twice: after the text and at exit) and its statistics (stderr: "encoded/decoded N tokens
    in S seconds", n_predict, n_drafted, n_accept)."""

    def number(pattern: str) -> float:
        found = re.search(pattern, stderr)
        if found is None:
            raise QuickdraftError(f"{BINARY}: its output has no {pattern!r} line")
        return float(found.group(1))

    seconds = number(r"encoded\s+\d+ tokens in\s+([\d.]+) seconds") + number(
        r"decoded\s+\d+ tokens in\s+([\d.]+) seconds"
    )
    if prompt_text not in stdout:
        raise QuickdraftError(f"{BINARY}: its output does not echo the prompt it was given")
    body = stdout[stdout.index(prompt_text) + len(prompt_text) :]
    return SpecRun(
        text=body.removesuffix("\n\n\n\n"),
        tokens=int(number(r"n_predict\s*=\s*(\d+)")),
        seconds=seconds,
        drafted=int(number(r"n_drafted\s*=\s*(\d+)")),
        accepted=int(number(r"n_accept\s*=\s*(\d+)")),
    )


def context_for(prompt_tokens: int, n: int, most: int = 4096) -> int:
    """The context a run needs: the prompt, `n` new tokens and 64 to spare (llama.cpp may tokenize the
    prompt's text a little longer), in steps of 256, at most `most`. Both models' KV caches and compute
    buffers are sized by it: a fixed 4096 held about 150 MB more for a HumanEval prompt (issue #49's 8 GB)."""
    return min(most, -(-(prompt_tokens + n + 64) // 256) * 256)


def command(
    binary: Path, target: Path, draft: Path, prompt: str, spec_keys: dict, threads: int, n: int, context: int = 4096
) -> list[str]:
    """The binary's command line: the draft model's speculation (`--spec-type draft-simple`: without it
    this build picks a type from the draft's metadata and fails), greedy, `n` tokens at most, this many
    threads for both models, a `context` of positions. The prompt goes as `-p` (`-f` drops a trailing
    newline)."""
    cmd = [str(binary), "-m", str(target), "-md", str(draft), "--spec-type", "draft-simple", "-p", prompt,
           "-n", str(n), "--temp", "0",
           "-t", str(threads), "-td", str(threads), "-c", str(context)]  # fmt: skip
    for key, flag in _FLAGS.items():
        if key in spec_keys:
            cmd += [flag, str(spec_keys[key])]
    return cmd


def draft_gguf(name: str, method: str = "llama-cpp") -> Path:
    """The draft's GGUF: a named model's joined file, or a path to one (`method` names the peer asking)."""
    from quickdraft.weights.default import NAMED_TARGETS, named_gguf

    if name in NAMED_TARGETS:
        return named_gguf(name)
    path = Path(name).expanduser()
    if path.suffix != ".gguf" or not path.is_file():
        raise QuickdraftError(
            f"{method}:draft= takes a named model ({', '.join(NAMED_TARGETS)}) or a FILE.gguf, not {name!r}"
        )
    return path


class LlamaSpecMethod:
    """A bench method running llama.cpp's draft-model speculation (`llama-speculative-simple`) on the
    target's GGUF with `draft=`'s GGUF, one process per prompt (a crash fails that prompt's method
    with its exit, as `ChildPeer` does)."""

    speculative = True

    def __init__(self, spec, target, dtype: str, runtime: str = "auto", quantize: str = "none") -> None:
        import torch

        if target.gguf is None or target.tokenizer is None:
            raise QuickdraftError(f"{spec.text}: the target {target.name} was not loaded from a GGUF file")
        self.spec, self.quant = spec, spec.get("quantize", "gguf")
        self.keys = {k: spec.get(k) for k in _FLAGS if spec.get(k) is not None}
        for key, value in self.keys.items():
            try:
                float(value) if key == "p_min" else int(value)
            except ValueError:
                raise QuickdraftError(f"{spec.text}: {key} must be a number, not {value!r}") from None
        self.draft = draft_gguf(spec.get("draft"))
        self.model = quantized_copy(target.gguf, self.quant)
        self.tokenizer, self.threads = target.tokenizer, torch.get_num_threads()
        self.eos = getattr(target.tokenizer, "eos_token_id", None)
        self.binary = speculative_binary()
        self.system_info = (self.binary.parent / "cmake_args.txt").read_text().strip()

    @property
    def weights(self) -> str:
        return f"llama-cpp:{self.quant}"

    def run(self, prompt_ids: list[int], max_new_tokens: int):
        prompt = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        with tempfile.TemporaryDirectory() as tmp:
            files = [Path(tmp) / name for name in ("out.txt", "err.txt")]
            context = context_for(len(prompt_ids), max_new_tokens)
            cmd = command(self.binary, self.model, self.draft, prompt, self.keys, self.threads, max_new_tokens, context)
            with files[0].open("w") as out, files[1].open("w") as err:
                proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
                peak = 0
                while proc.poll() is None:  # its own peak (VmHWM; the exit's rusage would count this
                    peak = max(peak, peak_rss_kib(proc.pid))  # process's pages it forked from)
                    time.sleep(0.05)
            code = proc.returncode
            out, err = files[0].read_text(errors="replace"), files[1].read_text(errors="replace")
        if code != 0:
            last = (err.strip().splitlines() or [""])[-1]
            raise PeerCrashed(f"{self.spec.text}: {BINARY} {describe_exit(code)}: {last}")
        CHILD_PEAKS[self.spec.text] = max(CHILD_PEAKS.get(self.spec.text, 0), peak)
        got = parse_run(out, err, prompt)
        tokens = self.tokenizer.encode(got.text, add_special_tokens=False)[:max_new_tokens]
        if len(tokens) < max_new_tokens and self.eos is not None:  # it stopped early: at an end token,
            tokens.append(self.eos)  # which it does not print (the tokenizer's own, as its plain rows end)
        seconds = got.seconds * min(1.0, len(tokens) / max(got.tokens, 1))  # prorated to the tokens kept
        rounds = got.tokens - got.accepted  # each target forward commits its accepted drafts and one token
        return RunOutput(tokens, seconds, max(rounds, 1), rounds, got.drafted, got.accepted)

    def close(self) -> None:
        """Nothing stays running between prompts."""
