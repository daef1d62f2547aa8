"""Benchmark harness: metric functions on synthetic rows, method parsing, the runner end to end on a
tiny model (with the hf-assisted peer), the compare diagnosis and the prompt sets."""

import json
from pathlib import Path

import pytest

from quickdraft import QuickdraftError
from quickdraft.bench.compare import find_mismatches
from quickdraft.bench.datasets import load_prompts
from quickdraft.bench.methods import build_method, parse_methods
from quickdraft.bench.metrics import group_metrics, summarize
from quickdraft.bench.runner import BenchConfig, run_bench
from quickdraft.weights.loading import load_model


def row(method, qid, run, tokens, wall, forwards, cat="a", drafted=0, accepted=0, drafts=0, match=True, pos=None):
    return {
        "method": method,
        "question_id": qid,
        "run": run,
        "category": cat,
        "new_tokens": tokens,
        "wall_s": wall,
        "target_forwards": forwards,
        "num_draft_tokens": drafted,
        "num_accepted": accepted,
        "num_drafts": drafts,
        "match_ar": match,
        "drafted_per_position": pos[0] if pos else [],
        "accepted_per_position": pos[1] if pos else [],
    }


def test_metrics_on_synthetic_rows():
    rows = [
        row("ar", "1", 0, 10, 1.0, 10),
        row("ar", "2", 0, 30, 3.0, 30, cat="b"),
        row("sd", "1", 0, 10, 0.5, 4, drafted=12, accepted=6, drafts=3, pos=([3, 3, 3, 3], [3, 2, 1, 0])),
        row("sd", "2", 0, 30, 1.0, 10, cat="b", drafted=36, accepted=21, drafts=9, match=False),
    ]
    s = summarize(rows)["methods"]
    assert s["ar"]["tokens_per_s"] == pytest.approx(10.0)
    assert s["ar"]["mean_accepted_tokens"] == pytest.approx(1.0)
    sd = s["sd"]
    assert sd["tokens_per_s"] == pytest.approx(40 / 1.5)
    assert sd["speedup_vs_ar"] == pytest.approx((40 / 1.5) / 10.0)
    assert sd["mean_accepted_tokens"] == pytest.approx(40 / 14)
    assert sd["draft_acceptance_rate"] == pytest.approx(27 / 48)
    assert sd["mean_acceptance_length"] == pytest.approx(1 + 27 / 12)
    assert sd["lossless_match_rate"] == pytest.approx(0.5)
    assert sd["acceptance_rate_per_position"] == pytest.approx([1.0, 2 / 3, 1 / 3, 0.0])
    assert sd["categories"]["a"]["speedup_vs_ar"] == pytest.approx(2.0)
    assert sd["categories"]["b"]["speedup_vs_ar"] == pytest.approx(3.0)


def test_the_share_of_rounds_that_drafted_is_reported():
    """Decode rounds = target forwards minus the prefill; the guard's plain rounds did not draft."""
    guarded = row("sd", "1", 0, 20, 1.0, 11, drafted=8, accepted=4, drafts=4)
    guarded["extra"] = {"guard_plain_rounds": 6, "guard_pauses": 1}
    rows = [row("ar", "1", 0, 20, 1.0, 20), guarded, row("sd2", "1", 0, 20, 1.0, 10, drafted=9, drafts=9)]
    s = summarize(rows)["methods"]
    assert s["sd"]["drafted_round_share"] == pytest.approx(1 - 6 / 10)
    assert s["sd2"]["drafted_round_share"] is None  # never kept plain: not reported


def test_run_spread_is_reported():
    rows = [row("ar", "1", r, 10, 1.0, 10) for r in range(2)]
    rows += [row("sd", "1", 0, 10, 0.5, 5), row("sd", "1", 1, 10, 1.0, 5)]
    m = group_metrics([r for r in rows if r["method"] == "sd"], [r for r in rows if r["method"] == "ar"])
    assert m["speedup_vs_ar"] == pytest.approx(1.5) and m["speedup_vs_ar_std"] > 0


def test_parse_methods():
    specs = parse_methods("ar,sd:drafter=model:/x/y,draft_length=3,hf-assisted:drafter=ngram,sd")
    assert [s.text for s in specs] == ["ar", "sd:drafter=model:/x/y,draft_length=3", "hf-assisted:drafter=ngram", "sd"]
    for bad, msg in [
        ("medusa", "unknown method"),
        ("pearl:draft_length=2", "no option"),
        ("sd:gamma=3", "no option"),
        ("sd:drafter", "key=value"),
        ("", "no methods"),
    ]:
        with pytest.raises(QuickdraftError, match=msg):
            parse_methods(bad)


def test_prompt_sets():
    spec = load_prompts("spec_bench")
    assert len(spec) == 480 and len({r.category for r in spec}) == 13
    quick = load_prompts("spec_bench", limit=1)
    assert len(quick) == 13
    assert len(load_prompts("humaneval")) == 164
    with pytest.raises(QuickdraftError, match="unknown categories"):
        load_prompts("spec_bench", categories=["nope"])


@pytest.fixture
def prompt_file(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [
        {"question_id": i, "category": c, "turns": [t]}
        for i, (c, t) in enumerate([("x", "abc abc abc"), ("x", "hello"), ("y", "the cat the cat")])
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return str(path)


def test_runner_end_to_end_with_peer(tiny_model_dir, prompt_file, tmp_path):
    out = tmp_path / "out"
    methods = (
        f"ar,sd:drafter=ngram,sd:drafter=model:{tiny_model_dir},draft_length=2,"
        f"sd:drafter=model:{tiny_model_dir},draft_length=3,hf-assisted:drafter=ngram,"
        f"hf-assisted:drafter=model:{tiny_model_dir},draft_length=3"
    )
    cfg = BenchConfig(
        methods=methods,
        prompts=prompt_file,
        max_new_tokens=16,
        runs=2,
        target=tiny_model_dir,
        dtype="float32",
        out=str(out),
    )
    summary = run_bench(cfg, progress=False)
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2 * 6
    for r in rows:
        if not r["method"].startswith("hf-assisted"):
            assert sum(r["accepted_lengths"]) == r["new_tokens"] and len(r["accepted_lengths"]) == r["target_forwards"]
    assert set(json.loads((out / "results.json").read_text())["methods"]) == {r["method"] for r in rows}
    for name in ("report.md", "speedup_by_category.png", "acceptance_by_position.png", "speedup_vs_draft_length.png"):
        assert (out / name).is_file(), name
    m = summary["methods"]
    model_sd = f"sd:drafter=model:{tiny_model_dir},draft_length=3"
    assert m[model_sd]["draft_acceptance_rate"] == 1.0  # the draft is the target itself
    assert m[model_sd]["mean_accepted_tokens"] > 1.5
    for name, s in m.items():
        assert s["lossless_match_rate"] == 1.0, name  # float32 tiny model: exact
        assert set(s["categories"]) == {"x", "y"}
    peer_name = f"hf-assisted:drafter=model:{tiny_model_dir},draft_length=3"
    peer = m[peer_name]
    assert peer["mean_accepted_tokens"] > 1.5  # HF really speculated (fewer target forwards than tokens)
    total, mismatches = find_mismatches(rows, "sd:drafter=ngram", None, "float32")
    assert total == 6 and mismatches == []
    # the prompt's prefill is timed apart (issue #69 item 3): ours by its first round, peers where they can
    assert all(r["prompt_tokens"] > 0 for r in rows)
    assert m["ar"]["prefill_tokens_per_s"] > 0 and m["sd:drafter=ngram"]["prefill_tokens_per_s"] > 0
    assert m[peer_name]["prefill_tokens_per_s"] is None  # transformers' generate() does not time it apart
    assert "| prefill tokens/s |" in (out / "report.md").read_text()


def test_the_prefill_rate_is_prompt_tokens_over_prefill_seconds():
    from quickdraft.bench.metrics import prefill_rate

    rows = [{"prompt_tokens": 100, "prefill_s": 0.5}, {"prompt_tokens": 50, "prefill_s": 0.25}, {"prompt_tokens": 9}]
    assert prefill_rate(rows) == 200.0  # the row that did not time it is left out
    assert prefill_rate([{"prompt_tokens": 9, "prefill_s": None}]) is None


def test_compare_diagnoses_a_mismatch(tiny_model_dir):
    from quickdraft.weights.loading import load_model

    target = load_model(tiny_model_dir, "float32").model
    ar = {"method": "ar", "run": 0, "question_id": "1", "token_ids": [5, 6, 7], "prompt_ids": [4, 5]}
    bad = {"method": "sd", "run": 0, "question_id": "1", "token_ids": [5, 9, 7]}
    total, found = find_mismatches([ar, bad], "sd", target, "float32")
    assert total == 1 and found[0].position == 1 and found[0].method_token == 9
    assert found[0].margin >= 0


def test_runner_with_pearl_sequential_and_parallel(tiny_model_dir, prompt_file, tmp_path):
    # unguarded: a draft as costly as the target loses on the cost model, and the guard's verdict carries
    # across greedy requests; a fixed window (the random tiny draft is never sure, so its p-min default
    # would stop every window at one token); this test is about PEARL's rounds
    seq_method = f"pearl:drafter=model:{tiny_model_dir},gamma=3,draft_schedule=fixed,parallel=0,guard=false"
    methods = f"ar,{seq_method},pearl:drafter=truncated:1,parallel=1"
    cfg = BenchConfig(
        methods=methods,
        prompts=prompt_file,
        max_new_tokens=16,
        runs=1,
        target=tiny_model_dir,
        dtype="float32",
        out=str(tmp_path / "out"),
    )
    m = run_bench(cfg, progress=False)["methods"]
    seq = m[seq_method]
    par = m["pearl:drafter=truncated:1,parallel=1"]
    for s in (seq, par):
        assert s["lossless_match_rate"] == 1.0 and s["num_draft_tokens"] > 0
    # draft == target: everything accepted, and PEARL's POST rounds commit gamma tokens per forward
    assert seq["draft_acceptance_rate"] == 1.0 and seq["mean_accepted_tokens"] > 2
    report = (tmp_path / "out" / "report.md").read_text()
    assert "PEARL MAT" in report


def test_runner_reports_tree_statistics(tiny_model_dir, prompt_file, tmp_path):
    methods = "ar,sd:drafter=truncated:1,tree=6,tree_width=3,hf-ar"
    cfg = BenchConfig(
        methods=methods,
        prompts=prompt_file,
        max_new_tokens=16,
        runs=1,
        target=tiny_model_dir,
        dtype="float32",
        out=str(tmp_path / "out"),
    )
    summary = run_bench(cfg, progress=False)
    tree = summary["methods"]["sd:drafter=truncated:1,tree=6,tree_width=3"]
    assert tree["lossless_match_rate"] == 1.0 and 1 <= tree["tree_mean_nodes"] <= 6
    hist = tree["tree_accepted_depth_histogram"]
    # the histogram counts whole accepted paths; the statistics stop at an EOS inside one
    assert sum(hist) > 0 and sum(d * n for d, n in enumerate(hist)) >= tree["num_accepted_draft_tokens"] > 0
    assert summary["methods"]["hf-ar"]["lossless_match_rate"] == 1.0  # the peer: transformers' generate()
    assert "tree nodes" in (tmp_path / "out" / "report.md").read_text()
    assert set(summary["machine"]) >= {"cpu_flags", "device", "torch"}
    assert summary["config"]["runtime"] == "auto"


def test_hf_assisted_defaults_to_prompt_lookup_and_refuses_model_free_drafters(tiny_target):
    from quickdraft.bench.methods import HFAssisted, parse_methods
    from quickdraft.errors import QuickdraftError

    (spec,) = parse_methods("hf-assisted")
    assert HFAssisted(spec, tiny_target, "float32").kwargs == {"prompt_lookup_num_tokens": 4}
    (spec,) = parse_methods("hf-assisted:drafter=suffix:none")
    with pytest.raises(QuickdraftError, match="hf-assisted takes"):
        HFAssisted(spec, tiny_target, "float32")


def test_bench_measures_batched_throughput(tiny_model_dir, prompt_file, tmp_path):
    """--batch: each run's prompts in one continuous batch beside the same method one at a time (a
    model drafter too: each row drafts with its own fork); a method that cannot batch (PEARL) is
    left out."""
    out = tmp_path / "out"
    # a pinned tree: under auto a tiny model's measured curve may say no budget pays on a loaded host
    model = f"model:{tiny_model_dir}"
    methods = f"ar,sd:drafter=suffix:none,draft_tree=4,sd:drafter={model},pearl:drafter={model}"
    cfg = BenchConfig(
        methods=methods, prompts=prompt_file, max_new_tokens=12, runs=1, target=tiny_model_dir, dtype="float64",
        batch=2, out=str(out),
    )  # fmt: skip
    batched = run_bench(cfg, progress=False)["batched"]
    assert set(batched) == {"ar", "sd:drafter=suffix:none,draft_tree=4", f"sd:drafter={model}"}
    for b in batched.values():
        assert b["matches_one_at_a_time"] == 1.0 and b["tokens_per_s"] > 0 and b["max_batch"] == 2
    assert "continuous batch" in (out / "report.md").read_text()


def test_compare_reads_rows_stored_compressed(tmp_path):
    import lzma

    from quickdraft.bench.compare import load_rows

    rows = [{"method": "ar", "question_id": "1", "run": 0, "token_ids": [1, 2]}]
    (tmp_path / "results.jsonl.xz").write_bytes(lzma.compress("".join(json.dumps(r) + "\n" for r in rows).encode()))
    (tmp_path / "results.json").write_text("{}")
    assert load_rows(tmp_path) == (rows, {})
    with pytest.raises(QuickdraftError, match="holds no benchmark results"):
        load_rows(tmp_path / "missing")


def test_bench_plot_draws_a_runs_plots_again(tmp_path, capsys):
    """`quickdraft bench plot OUT` redraws the plots a run's folder no longer tracks, from its
    results.json; a folder without one is refused in one line (exit 2)."""
    import shutil

    from quickdraft.cli import main

    run = Path(__file__).resolve().parents[1] / "docs" / "bench" / "attend-quick"
    shutil.copy(run / "results.json", tmp_path / "results.json")
    assert main(["bench", "plot", str(tmp_path)]) == 0
    assert (tmp_path / "speedup_by_category.png").stat().st_size > 1000
    assert (tmp_path / "acceptance_by_position.png").is_file()
    assert main(["bench", "plot", str(tmp_path / "none")]) == 2
    assert "holds no results.json" in capsys.readouterr().err


def test_a_sampled_method_runs_seeded_and_is_not_compared_token_for_token(tiny_model_dir, prompt_file, tmp_path):
    methods = f"ar:temperature=0.8,sd:drafter=model:{tiny_model_dir},draft_length=3,temperature=0.8"

    def bench(out):
        cfg = BenchConfig(methods=methods, prompts=prompt_file, max_new_tokens=12, runs=1, target=tiny_model_dir,
                          dtype="float32", out=str(tmp_path / out))  # fmt: skip
        summary = run_bench(cfg, progress=False)
        return summary, [json.loads(line) for line in (tmp_path / out / "results.jsonl").read_text().splitlines()]

    summary, rows = bench("a")
    m = summary["methods"]
    assert set(m) == {"ar", "ar:temperature=0.8", methods.split(",", 1)[1]}  # greedy ar added: the reference
    assert m["ar"]["lossless_match_rate"] == 1.0
    for name in ("ar:temperature=0.8", methods.split(",", 1)[1]):
        assert m[name]["lossless_match_rate"] is None and m[name]["agreement_with_ar"] is None
        assert all(r["match_ar"] is None for r in rows if r["method"] == name)
    assert m[methods.split(",", 1)[1]]["mean_accepted_tokens"] > 1.0  # it speculated
    report = (tmp_path / "a" / "report.md").read_text()
    assert "| sampled |" in report
    again = {(r["method"], r["question_id"]): r["token_ids"] for r in bench("b")[1]}
    assert again == {(r["method"], r["question_id"]): r["token_ids"] for r in rows}  # seeded: reproducible
    sampled = [r["token_ids"] for r in rows if r["method"] == "ar:temperature=0.8"]
    greedy = [r["token_ids"] for r in rows if r["method"] == "ar"]
    assert sampled != greedy  # negative control: the temperature reached the sampler
    with pytest.raises(QuickdraftError, match="temperature"):
        build_method(parse_methods("ar:temperature=hot")[0], load_model(tiny_model_dir, "float32"), "float32")
