"""A peer that dies cannot take the bench with it (issue #47): a child process's signal or exit is one
method's one-line failure (`bench/peers/child.py`), the bench runs the others and reports what died;
and the llama.cpp build flags follow the host's instruction sets, AMX never."""

from __future__ import annotations

import json
import signal
import textwrap

import pytest

from quickdraft import QuickdraftError
from quickdraft.bench import runner
from quickdraft.bench.outputs import RunOutput
from quickdraft.bench.peers.child import ChildPeer, PeerCrashed, describe_exit
from quickdraft.bench.peers.llama_cmake import cmake_args, cpu_flags
from quickdraft.bench.runner import BenchConfig, run_bench

WORKER = """
import json, os, signal, sys
for line in sys.stdin:
    op = json.loads(line)["op"]
    if op == "echo":
        print(json.dumps({"ok": True, "pid": os.getpid()}), flush=True)
    elif op == "fail":
        print(json.dumps({"error": "no such file"}), flush=True)
    elif op == "ill":
        os.kill(os.getpid(), signal.SIGILL)
    elif op == "exit":
        sys.exit(3)
    elif op == "close":
        break
"""


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(textwrap.dedent(WORKER))
    return path


def test_a_child_killed_by_a_signal_is_a_one_line_failure(worker):
    child = ChildPeer("peer", worker)
    assert child.call("echo")["ok"]
    with pytest.raises(QuickdraftError, match="peer: no such file"):  # failed without dying: it lives on
        child.call("fail")
    assert child.call("echo")["ok"]
    with pytest.raises(PeerCrashed, match=r"^peer: its process killed by SIGILL \(Illegal instruction\) during 'ill'$"):
        child.call("ill")
    with pytest.raises(PeerCrashed):  # dead stays dead, and says so again
        child.call("echo")
    child.close()
    other = ChildPeer("other", worker)
    with pytest.raises(PeerCrashed, match="exited with status 3"):
        other.call("exit")
    other.close()
    assert describe_exit(-signal.SIGSEGV).startswith("killed by SIGSEGV") and describe_exit(None) == "is still running"


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "q.jsonl"
    texts = [("x", "abc abc abc abc"), ("x", "hello hello hello"), ("y", "the cat the cat the cat")]
    path.write_text(
        "\n".join(json.dumps({"question_id": i, "category": c, "turns": [t]}) for i, (c, t) in enumerate(texts))
    )
    return str(path)


class _Crashing:
    """A peer method whose process dies on its `dies_at`-th run (the warm-up is run 0)."""

    speculative = False
    weights = "none"

    def __init__(self, dies_at: int) -> None:
        self.runs, self.dies_at, self.closed = 0, dies_at, False

    def run(self, prompt_ids, max_new_tokens):
        self.runs += 1
        if self.runs > self.dies_at:
            raise PeerCrashed("peer-x: its process killed by SIGILL (Illegal instruction) during 'run'")
        return RunOutput(list(prompt_ids[:max_new_tokens]), 0.01, max_new_tokens)

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("dies_at", [0, 2])  # in the warm-up; on the second prompt
def test_the_bench_goes_on_without_a_peer_that_died(monkeypatch, tiny_model_dir, prompt_file, tmp_path, dies_at):
    real = runner.build_method
    crashing = _Crashing(dies_at)

    def build(spec, *args, **kwargs):
        return crashing if spec.name == "hf-ar" else real(spec, *args, **kwargs)

    monkeypatch.setattr(runner, "build_method", build)
    out = tmp_path / "out"
    cfg = BenchConfig(
        methods="ar,sd:drafter=ngram,hf-ar", prompts=prompt_file, max_new_tokens=8, runs=1,
        target=tiny_model_dir, dtype="float32", out=str(out),
    )  # fmt: skip
    summary = run_bench(cfg, progress=False)
    assert set(summary["methods"]) == {"ar", "sd:drafter=ngram"}  # the others ran every prompt
    assert summary["methods"]["sd:drafter=ngram"]["num_draft_tokens"] > 0  # speculation happened
    assert "SIGILL" in summary["failed"]["hf-ar"] and crashing.closed
    assert "`hf-ar`: peer-x: its process killed by SIGILL" in (out / "report.md").read_text()
    assert "failed" in json.loads((out / "results.json").read_text())


class _Lookup(_Crashing):
    """A method compared with a plain peer: it must never run once it was dropped (and closed)."""

    def run(self, prompt_ids, max_new_tokens):
        assert not self.closed, "a dropped method ran after it was closed"
        return super().run(prompt_ids, max_new_tokens)


def test_the_bench_does_not_run_a_method_whose_reference_died_this_round(
    monkeypatch, tiny_model_dir, prompt_file, tmp_path
):
    real = runner.build_method
    plain, lookup = _Crashing(2), _Lookup(10**6)
    fakes = {"llama-cpp:quantize=gguf": plain, "llama-cpp:lookup=2": lookup}
    monkeypatch.setattr(runner, "build_method", lambda spec, *a, **k: fakes.get(spec.text) or real(spec, *a, **k))
    cfg = BenchConfig(
        methods="ar,llama-cpp:lookup=2", prompts=prompt_file, max_new_tokens=8, runs=1,
        target=tiny_model_dir, dtype="float32", out=str(tmp_path / "out"),
    )  # fmt: skip
    summary = run_bench(cfg, progress=False)
    assert set(summary["methods"]) == {"ar"} and lookup.closed and plain.closed
    assert "its plain reference llama-cpp:quantize=gguf died" in summary["failed"]["llama-cpp:lookup=2"]


def test_a_dead_plain_reference_drops_what_compares_with_it():
    failures = runner.Failures(
        {"ar": True, "llama-cpp:quantize=gguf": True, "llama-cpp:lookup=2": False},
        {"ar": "none", "llama-cpp:quantize=gguf": "llama-cpp:gguf", "llama-cpp:lookup=2": "llama-cpp:gguf"},
    )
    closed = []
    method = type("M", (), {"close": lambda self: closed.append(1)})
    methods = {"ar": method(), "llama-cpp:quantize=gguf": method(), "llama-cpp:lookup=2": method()}
    with failures.guard("llama-cpp:quantize=gguf", methods):
        raise PeerCrashed("llama-cpp:quantize=gguf: its process killed by SIGILL (Illegal instruction) during 'run'")
    assert list(methods) == ["ar"] and len(closed) == 2
    assert "its plain reference llama-cpp:quantize=gguf died" in failures.reasons["llama-cpp:lookup=2"]
    with pytest.raises(ValueError):  # anything else is not a peer's death: it propagates
        with failures.guard("ar", methods):
            raise ValueError("a bug")


def test_llama_cpp_build_flags_follow_the_host_and_never_use_amx():
    amx_xeon = cpu_flags(
        "processor: 0\nflags\t\t: fpu avx avx2 fma f16c bmi2 avx512f avx512cd avx512vl avx512dq avx512bw "
        "avx512vbmi avx512_vnni avx512_bf16 amx_bf16 amx_int8 amx_tile\n"
    )
    args = cmake_args(amx_xeon)
    assert "-DGGML_NATIVE=OFF" in args and "-DGGML_AVX512_BF16=ON" in args and "-DGGML_AVX512=ON" in args
    assert {"-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"} <= set(args)
    avx2_only = cmake_args({"avx", "avx2", "fma", "f16c", "bmi2"})
    assert "-DGGML_AVX2=ON" in avx2_only and "-DGGML_AVX512=OFF" in avx2_only and "-DGGML_AVX512_VNNI=OFF" in avx2_only
    assert not any(a.endswith("AMX_TILE=ON") for a in avx2_only)


PEER_PACKAGES = {"llama_cpp", "ik_llama_cpp", "openvino", "openvino_genai", "numpy"}  # what the workers import


def shadowing(folder, packages=PEER_PACKAGES) -> list[str]:
    """Files in a worker's folder named as a package is: run by path, the folder is first on the import
    path, so such a file would be imported in the package's place."""
    import importlib.util

    return sorted(
        p.name for p in folder.glob("*.py") if p.stem in packages or importlib.util.find_spec(p.stem) is not None
    )


def test_no_file_beside_the_peers_workers_shadows_a_package(tmp_path):
    """bench/peers/ is the workers' folder; none of its files takes a package's name. Control: a folder
    holding a `llama_cpp.py` (as the bench's llama.cpp peer was once named) is caught."""
    from quickdraft.bench.peers import child

    folder = __import__("pathlib").Path(child.__file__).parent
    assert sorted(p.name for p in folder.glob("*_worker.py")) == [
        "ik_llama_cpp_worker.py", "llama_cpp_worker.py", "openvino_worker.py"
    ]  # fmt: skip
    assert shadowing(folder) == []
    (tmp_path / "llama_cpp.py").write_text("")
    (tmp_path / "json.py").write_text("")
    assert shadowing(tmp_path) == ["json.py", "llama_cpp.py"]
