"""llama.cpp's own draft-model speculation as a bench peer (bench/peers/llama_spec_peer.py): its build arguments
and cache key, its command line, reading a real run's output (tests/data/llama_spec: a run of the built
`llama-speculative-simple` on the Qwen pair), and the method end to end on a stand-in binary that
prints what the real one prints (its tokens, the end token it does not print, the budget's proration,
a crash as one method's failure)."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

from quickdraft import QuickdraftError
from quickdraft.bench.methods import build_method, parse_methods
from quickdraft.bench.peers import llama_spec_peer as llama_spec
from quickdraft.bench.peers.child import CHILD_PEAKS, PeerCrashed, peak_rss_kib
from quickdraft.bench.peers.llama_spec_peer import (
    LlamaSpecMethod,
    binary_path,
    build_args,
    command,
    context_for,
    parse_run,
)
from quickdraft.bench.runner import _is_plain, _methods_with_ar
from quickdraft.weights.loading import LoadedModel

DATA = Path(__file__).parent / "data" / "llama_spec"
PROMPT = '<|im_start|>user\nComplete this Python function.\n```python\ndef add(a, b):\n    """Return a + b."""\n```'
PROMPT += "<|im_end|>\n<|im_start|>assistant\n"


def test_build_arguments_keep_the_peer_flags_and_add_one_static_example_binary():
    args = build_args({"avx2", "fma", "f16c", "amx_tile", "amx_int8"})
    assert "-DLLAMA_BUILD_EXAMPLES=ON" in args and "-DLLAMA_BUILD_EXAMPLES=OFF" not in args
    assert "-DBUILD_SHARED_LIBS=OFF" in args and "-DGGML_AMX_INT8=OFF" in args and "-DGGML_AVX2=ON" in args
    avx2, avx512 = binary_path("0.3.36", {"avx2"}), binary_path("0.3.36", {"avx2", "avx512f", "avx512_bf16"})
    assert avx2 != avx512 and avx2.name == "llama-speculative-simple" and "0.3.36" in avx2.parent.name
    assert binary_path("0.3.37", {"avx2"}) != avx2


def test_the_command_line_names_the_draft_type_keeps_the_prompt_and_maps_the_keys():
    cmd = command(Path("/b"), Path("t.gguf"), Path("d.gguf"), PROMPT, {"draft_max": "16", "p_min": "0.75"}, 2, 96)
    assert cmd[cmd.index("--spec-type") + 1] == "draft-simple"
    assert cmd[cmd.index("-p") + 1] == PROMPT  # verbatim: -f would drop the trailing newline
    assert cmd[cmd.index("--spec-draft-n-max") + 1] == "16" and cmd[cmd.index("--spec-draft-p-min") + 1] == "0.75"
    assert "--spec-draft-n-min" not in cmd and cmd[cmd.index("-n") + 1] == "96" and "--temp" in cmd
    assert cmd[cmd.index("-c") + 1] == "4096"
    sized = command(Path("/b"), Path("t.gguf"), Path("d.gguf"), PROMPT, {}, 2, 128, context_for(300, 128))
    assert sized[sized.index("-c") + 1] == "512"  # 300 + 128 + 64 spare, in steps of 256


def test_a_runs_context_holds_its_prompt_and_tokens():
    assert context_for(300, 128) == 512 and context_for(321, 128) == 768 and context_for(5000, 128) == 4096
    assert all(context_for(t, n) >= min(t + n + 64, 4096) for t in (1, 200, 700, 3000) for n in (1, 128, 512))


def test_a_real_runs_output_is_read():
    got = parse_run((DATA / "stdout.txt").read_text(), (DATA / "stderr.txt").read_text(), PROMPT)
    assert got.text == '```python\ndef add(a, b):\n    """Return a + b."""\n    return a + b\n```'
    assert (got.tokens, got.drafted, got.accepted) == (24, 18, 18)
    assert got.seconds == pytest.approx(0.305 + 0.928)
    with pytest.raises(QuickdraftError, match="does not echo the prompt"):
        parse_run((DATA / "stdout.txt").read_text(), (DATA / "stderr.txt").read_text(), "another prompt")
    with pytest.raises(QuickdraftError, match="n_accept"):
        stats = "encoded 3 tokens in 0.1 seconds\ndecoded 2 tokens in 0.2 seconds\nn_predict = 2\nn_drafted = 2\n"
        parse_run((DATA / "stdout.txt").read_text(), stats, PROMPT)


def test_its_options_are_checked():
    assert [s.text for s in _methods_with_ar("llama-cpp:draft=qwen2.5-coder-0.5b,p_min=0.75")] == [
        "ar",
        "llama-cpp:quantize=gguf",
        "llama-cpp:draft=qwen2.5-coder-0.5b,p_min=0.75",
    ]
    assert not _is_plain(parse_methods("llama-cpp:draft=x.gguf")[0]) and _is_plain(parse_methods("llama-cpp")[0])
    target = LoadedModel(None, None, "t", gguf=Path("t.gguf"))
    with pytest.raises(QuickdraftError, match="need draft="):
        build_method(parse_methods("llama-cpp:p_min=0.5")[0], target, "float32")
    with pytest.raises(QuickdraftError, match="not both"):
        build_method(parse_methods("llama-cpp:draft=x.gguf,lookup=3")[0], target, "float32")


FAKE = """#!{python}
import os, signal, sys, time
args = sys.argv[1:]
prompt, n = args[args.index("-p") + 1], int(args[args.index("-n") + 1])
if "CRASH" in prompt:
    os.kill(os.getpid(), signal.SIGILL)
text = "def f():\\n    return 1\\n" if "SHORT" in prompt else "x" * (n + 4)  # an end token, or past the budget
made = 7 if "SHORT" in prompt else n + 4
time.sleep(0.2)  # alive long enough for its peak to be read
sys.stdout.write("\\n\\n" + prompt + text + "\\n\\n" + "\\n\\n")
sys.stderr.write(f"I encoded 5 tokens in 0.500 seconds\\nI decoded {{made}} tokens in 1.000 seconds\\n"
                 f"I n_predict = {{made}}\\nI n_drafted = 9\\nI n_accept  = 6\\n")
"""


class _Tokenizer:
    """Characters as token ids; 0 the end token."""

    eos_token_id = 0

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


@pytest.fixture
def fake_method(tmp_path, monkeypatch):
    binary = tmp_path / "llama-speculative-simple"
    binary.write_text(FAKE.format(python=sys.executable))
    binary.chmod(binary.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "cmake_args.txt").write_text("-DGGML_AVX2=ON\n")
    monkeypatch.setattr(llama_spec, "speculative_binary", lambda: binary)
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    target = LoadedModel(None, _Tokenizer(), "t", gguf=tmp_path / "target.gguf")
    return lambda keys="": LlamaSpecMethod(parse_methods(f"llama-cpp:draft={draft}{keys}")[0], target, "float32")


def test_the_method_runs_the_binary_and_reads_its_tokens(fake_method):
    method = fake_method(",draft_max=5")
    assert method.keys == {"draft_max": "5"} and method.system_info == "-DGGML_AVX2=ON"
    short = method.run([ord(c) for c in "SHORT "], 32)
    assert short.token_ids == [ord(c) for c in "def f():\n    return 1\n"] + [0]  # the end token it did not print
    assert short.wall_s == pytest.approx(1.5) and (short.num_draft_tokens, short.num_accepted) == (9, 6)
    own = peak_rss_kib(os.getpid())
    assert 0 < CHILD_PEAKS[method.spec.text] < own  # the child's own peak, not this process's pages
    long = method.run([ord(c) for c in "LONG "], 16)
    assert long.token_ids == [ord("x")] * 16  # the round that ran past the budget is cut to it
    assert long.wall_s == pytest.approx(1.5 * 16 / 20)  # and its time prorated to the tokens kept


def test_a_crash_is_this_methods_one_line_failure(fake_method):
    with pytest.raises(PeerCrashed, match="killed by SIGILL"):
        fake_method().run([ord(c) for c in "CRASH"], 8)
    with pytest.raises(QuickdraftError, match="must be a number"):
        fake_method(",p_min=high")
