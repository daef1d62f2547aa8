"""The server's limits. Issue #79 item 6: a queue instead of refusals. The server's default queue is
sized by the host's free memory (a waiting request holds its body and prompt ids, no KV cache), so many
clients on a small batch are all answered, each greedy answer equal to its lone one; `--max-queue` still
bounds it (the control: the old fixed bound refuses some of the same load with 429). Issue #80: a short
context gets ready."""

from __future__ import annotations

import threading

import httpx
import torch
from test_server import NAME, NoEos, SlowSuffix, serve_on_loopback

from quickdraft.engine import Engine
from quickdraft.server import ServeConfig
from quickdraft.server.admission import MAX_BODY_BYTES, QUEUE_CAP, queue_size
from quickdraft.server.app import create_app
from quickdraft.settings.options import EngineConfig

from conftest import tiny_text_model

GIB = 1 << 30


def test_the_queue_is_sized_by_free_memory_and_the_flag_wins():
    assert queue_size(3, MAX_BODY_BYTES, available=64 * GIB) == 3  # given: kept, 0 included
    assert queue_size(0, MAX_BODY_BYTES, available=64 * GIB) == 0
    assert queue_size(None, MAX_BODY_BYTES, available=1 * GIB) == 60  # 512 MiB over 8.5 MiB a request
    assert queue_size(None, MAX_BODY_BYTES, available=16 * GIB) == 963
    assert queue_size(None, MAX_BODY_BYTES, available=10**15) == QUEUE_CAP
    assert queue_size(None, MAX_BODY_BYTES, available=1 << 20) == 8  # never below the old default
    assert queue_size(None, MAX_BODY_BYTES, available=None) in (8, *range(8, QUEUE_CAP + 1))
    assert ServeConfig().max_queue is None


def _answers(max_queue: int | None, prompts: list[str]) -> tuple[list[int], list[str | None], list[str]]:
    """Statuses and texts of `prompts` sent at once to a server of 2 rows, and each prompt's lone answer."""
    target = tiny_text_model(dtype=torch.float64)
    engine = Engine(NoEos(target.model, target.tokenizer, target.name), EngineConfig(), drafter=SlowSuffix(None))
    app = create_app(lambda: engine, NAME, max_queue=max_queue, default_max_tokens=16, max_batch=2)
    statuses, texts = [0] * len(prompts), [None] * len(prompts)
    with serve_on_loopback(app) as url:

        def ask(i: int) -> None:
            body = {"prompt": prompts[i], "max_tokens": 12, "temperature": 0}
            with httpx.Client(timeout=120) as http:
                r = http.post(url + "/v1/completions", json=body)
            statuses[i] = r.status_code
            texts[i] = r.json()["choices"][0]["text"] if r.status_code == 200 else None

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        alone = [engine.generate(p, raw=True, max_new_tokens=12).text for p in prompts]
    return statuses, texts, alone


def test_sixteen_clients_on_two_rows_are_all_answered_as_alone():
    prompts = [f"{'abc' * (i % 4 + 1)} {i}" for i in range(16)]
    statuses, texts, alone = _answers(None, prompts)
    assert statuses == [200] * 16 and texts == alone
    statuses, _, _ = _answers(2, prompts)  # control: a fixed queue of 2 refuses part of the same load
    assert 429 in statuses


def test_a_model_with_a_context_under_the_warm_up_prompt_gets_ready():
    """The warm-up's prompt and new tokens fit the context (they were 256 + 8 whatever the model, so a
    context under 264 never got ready); the prompt limit stays within the context."""
    from fastapi.testclient import TestClient
    from test_server import wait_ready

    target = tiny_text_model(seed=1)
    target.model.config.max_position_embeddings = 100
    engine = Engine(target, EngineConfig(method="ar"))
    assert engine.context_length == 100
    app = create_app(lambda: engine, NAME, default_max_tokens=8)
    with TestClient(app) as c:
        wait_ready(c, timeout=60)
        assert app.state.quickdraft["error"] is None and app.state.quickdraft["max_prompt_tokens"] <= 100
        assert c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 4}).status_code == 200


def test_metrics_say_what_the_defaults_chose():
    """Issue #80: the defaults' choice (statistics and bench reports had it) is in Prometheus /metrics."""
    from fastapi.testclient import TestClient
    from test_server import wait_ready

    engine = Engine(tiny_text_model(seed=2), EngineConfig(method="ar"))
    engine.choices = {"weights": "w4a8: the GGUF's own blocks", "drafter": "mix:model:x: its draft, with suffix"}
    app = create_app(lambda: engine, NAME, warm=False)
    with TestClient(app) as c:
        wait_ready(c)
        text = c.get("/metrics").text
    line = next(line for line in text.splitlines() if line.startswith("quickdraft:defaults_info{"))
    assert (
        'weights="w4a8"' in line
        and 'drafter="mix:model:x"' in line
        and 'drafter_reason="its draft, with suffix"' in line
    )
