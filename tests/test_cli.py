"""CLI: --help everywhere, one-line errors with exit 2 and no traceback, JSON output equal to the API."""

import json
import subprocess
import sys

import pytest

from quickdraft import Engine, EngineConfig
from quickdraft.cli import main
from quickdraft.weights.loading import load_model


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["generate", "--help"],
        ["prepare", "--help"],
        ["bench", "--help"],
        ["bench", "compare", "--help"],
        ["bench", "doc", "--help"],
    ],
)
def test_help_exits_zero(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0


def _gen(tiny_model_dir, *extra):
    return ["generate", "abc", "--target", tiny_model_dir, "--dtype", "float32", "--max-new-tokens", "12", *extra]


def test_generate_json_matches_library(tiny_model_dir, capsys):
    assert main(_gen(tiny_model_dir, "--json", "--drafter", f"model:{tiny_model_dir}", "--draft-length", "3")) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"text", "token_ids", "finish_reason", "stats"}
    assert out["stats"]["num_draft_tokens"] > 0
    assert out["stats"]["draft_acceptance_rate"] == 1.0  # draft == target
    engine = Engine.load(tiny_model_dir, EngineConfig(method="ar"), "float32")
    assert out["token_ids"] == engine.generate("abc", max_new_tokens=12).token_ids


def test_generate_prints_text_and_stats(tiny_model_dir, capsys):
    assert main(_gen(tiny_model_dir, "--method", "ar")) == 0
    text = capsys.readouterr().out
    assert "mean_acceptance_length" in text and "tokens/s" in text


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--drafter", "bogus"], "unknown drafter"),
        (["--drafter", "model:/does/not/exist"], "model folder not found"),
        (["--temperature", "-1"], "temperature"),
        (["--top-p", "0"], "top_p"),
        (["--draft-length", "0"], "draft length"),
        (["--max-new-tokens", "0"], "max_new_tokens"),
        (["--threads", "0"], "threads"),
    ],
)
def test_bad_input_is_one_line_exit_2(tiny_model_dir, capsys, extra, message):
    assert main(_gen(tiny_model_dir, *extra)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and "Traceback" not in err[0]


def test_bad_target_path_in_a_subprocess_has_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "quickdraft.cli", "generate", "hi", "--target", "/nope"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == "quickdraft: error: model folder not found: /nope"


def test_unknown_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate", "hi", "--no-such-flag"])
    assert exc.value.code == 2


def test_vocab_mismatch_fails_before_generation(tiny_model_dir, tmp_path, capsys):
    from conftest import tiny_llama

    other = tiny_llama(vocab=50)
    other.model.save_pretrained(tmp_path)
    assert main(_gen(tiny_model_dir, "--drafter", f"model:{tmp_path}")) == 2
    assert "output tokens" in capsys.readouterr().err


def test_load_model_rejects_a_folder_without_config(tmp_path):
    from quickdraft import QuickdraftError

    with pytest.raises(QuickdraftError, match="no config.json"):
        load_model(str(tmp_path))


def test_bench_doc_keeps_the_pages_text_and_rewrites_its_reports(tmp_path):
    """docs/benchmarks.md is written in one place: `bench doc` keeps what the page holds above the
    reports heading and replaces the reports under it (plot links made relative to the page)."""
    runs = tmp_path / "runs"
    for name, body in (("one", "## run one\n![p](p.png)\n"), ("two", "## run two\n")):
        (runs / name).mkdir(parents=True)
        (runs / name / "report.md").write_text(body)
    page = tmp_path / "docs" / "benchmarks.md"
    page.parent.mkdir()
    page.write_text("# Benchmarks\n\nhand-written summary\n\n# Reports written by the harness\n\n## stale report\n")
    assert main(["bench", "doc", str(runs / "one"), str(runs / "two"), "--output", str(page)]) == 0
    text = page.read_text()
    assert text.startswith("# Benchmarks\n\nhand-written summary\n\n# Reports written by the harness\n")
    assert "stale report" not in text and "## run one" in text and "## run two" in text
    assert "](../runs/one/p.png)" in text
    assert main(["bench", "doc", str(runs / "two"), "--output", str(page)]) == 0  # again: the text stays once
    again = page.read_text()
    assert again.count("hand-written summary") == 1 and "## run one" not in again
