"""Window discovery (design §4.5): each server dialect against a small fake over loopback, the cache, the
timeout, and a session that starts with what its server said (and a configured window that wins)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from runtime.gateway import WindowBook
from runtime.gateway._windows import (
    window_from_lmstudio,
    window_from_models,
    window_from_ollama,
    window_from_props,
)

Routes = dict[tuple[str, str], Callable[[dict[str, Any]], Any]]


class Fake:
    """A loopback server answering ``routes[(method, path)](json_body)`` with JSON (404 otherwise)."""

    def __init__(self, routes: Routes, delay: float = 0.0) -> None:
        self.routes, self.delay, self.hits = routes, delay, []
        self.headers: list[dict[str, str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, method: str) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length)) if length else {}
                fake.hits.append((method, self.path, body))
                fake.headers.append(dict(self.headers))
                time.sleep(fake.delay)
                route = fake.routes.get((method, self.path))
                data = json.dumps(route(body)).encode() if route else b'{"error":"not found"}'
                self.send_response(200 if route else 404)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_port}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake() -> Iterator[Callable[..., Fake]]:
    made: list[Fake] = []

    def make(routes: Routes, delay: float = 0.0) -> Fake:
        made.append(Fake(routes, delay))
        return made[-1]

    yield make
    for f in made:
        f.close()


# What each server answers, as its own software shapes it.
LLAMA_PROPS = {
    "default_generation_settings": {"n_ctx": 512, "params": {"n_predict": -1}},
    "total_slots": 4,
    "model_path": "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
}
LLAMA_MODELS = {  # an older llama.cpp's /v1/models: n_ctx_train is the training context, not the server's
    "object": "list",
    "data": [{"id": "smollm2", "object": "model", "owned_by": "llamacpp", "meta": {"n_ctx_train": 8192}}],
}
LLAMA_MODELS_NEW = {  # a newer one's: meta.n_ctx is a slot's context
    "object": "list",
    "data": [
        {
            "id": "x.gguf",
            "object": "model",
            "owned_by": "llamacpp",
            "meta": {"n_ctx": 512, "n_ctx_train": 8192},
        }
    ],
}
VLLM_MODELS = {
    "object": "list",
    "data": [
        {"id": "Qwen/Qwen2.5-7B-Instruct", "object": "model", "owned_by": "vllm", "max_model_len": 32768},
        {"id": "other", "object": "model", "owned_by": "vllm", "max_model_len": 4096},
    ],
}
OPENROUTER_MODELS = {
    "data": [
        {"id": "acme/tiny", "context_length": 65536, "top_provider": {"context_length": 65536}},
        {"id": "acme/big", "context_length": 1_000_000},
    ]
}
LMSTUDIO_MODELS = {
    "object": "list",
    "data": [
        {"id": "qwen2-vl-7b", "type": "vlm", "state": "not-loaded", "max_context_length": 32768},
        {
            "id": "meta-llama-3.1-8b-instruct",
            "type": "llm",
            "state": "loaded",
            "max_context_length": 131072,
            "loaded_context_length": 8192,
        },
    ],
}
OLLAMA_SHOW = {
    "parameters": 'num_ctx                        6144\nstop                           "<|eot_id|>"',
    "model_info": {"general.architecture": "llama", "llama.context_length": 131072},
}


def test_the_readers_take_each_dialects_window() -> None:
    assert window_from_props(LLAMA_PROPS) == 512
    assert window_from_props({"n_ctx": 4096, "total_slots": 4}) == 1024  # a total is shared by the slots
    assert window_from_models(LLAMA_MODELS, "openai/smollm2") is None  # n_ctx_train is not the window
    assert window_from_models(LLAMA_MODELS_NEW, "openai/smollm2") == 512  # the only model served
    assert window_from_models(VLLM_MODELS, "hosted_vllm/Qwen/Qwen2.5-7B-Instruct") == 32768
    assert window_from_models(VLLM_MODELS, "openai/unknown") is None  # two models, none of them named
    assert window_from_models(OPENROUTER_MODELS, "openrouter/acme/tiny") == 65536
    assert window_from_lmstudio(LMSTUDIO_MODELS, "openai/meta-llama-3.1-8b-instruct") == 8192
    assert window_from_lmstudio(LMSTUDIO_MODELS, "qwen2-vl-7b") == 32768
    assert window_from_ollama(OLLAMA_SHOW) == 6144
    assert window_from_ollama({"model_info": {"qwen2.context_length": 32768}}) == 32768
    for reader in (window_from_props, window_from_ollama):
        assert reader(None) is None and reader({"n_ctx": True}) is None and reader([1, 2]) is None


@pytest.mark.parametrize(
    ("name", "routes", "model", "window", "source"),
    [
        (
            "llama.cpp",
            {("GET", "/props"): lambda _: LLAMA_PROPS, ("GET", "/v1/models"): lambda _: LLAMA_MODELS},
            "openai/smollm2",
            512,
            "props",
        ),
        (
            "vllm",
            {("GET", "/v1/models"): lambda _: VLLM_MODELS},
            "openai/Qwen/Qwen2.5-7B-Instruct",
            32768,
            "models",
        ),
        (
            "openrouter",
            {("GET", "/v1/models"): lambda _: OPENROUTER_MODELS},
            "openai/acme/tiny",
            65536,
            "models",
        ),
        (
            "lm studio",
            {("GET", "/api/v0/models"): lambda _: LMSTUDIO_MODELS},
            "openai/meta-llama-3.1-8b-instruct",
            8192,
            "lmstudio",
        ),
        (
            "ollama",
            {("POST", "/api/show"): lambda body: OLLAMA_SHOW if body == {"model": "llama3.1"} else None},
            "openai/llama3.1",
            6144,
            "ollama",
        ),
    ],
)
def test_each_server_is_asked_in_its_dialect_once(
    fake: Callable[..., Fake], name: str, routes: Routes, model: str, window: int, source: str
) -> None:
    server = fake(routes)
    book = WindowBook()
    found = book.discover(server.url, model, timeout=2.0)
    assert found is not None and (found.window, found.source) == (window, source)
    hits = len(server.hits)
    for _ in range(3):  # cached: the server is asked once per endpoint and model
        assert book.discover(server.url, model, timeout=2.0) == found
    assert len(server.hits) == hits and book.asked == 1


def test_a_server_that_says_nothing_is_a_miss_remembered_for_a_while(fake: Callable[..., Fake]) -> None:
    server = fake({})
    now = [0.0]
    book = WindowBook(clock=lambda: now[0])
    assert book.discover(server.url, "openai/x", timeout=2.0) is None
    hits = len(server.hits)
    assert hits == 4  # the four dialects, each answered 404
    assert book.discover(server.url, "openai/x", timeout=2.0) is None and len(server.hits) == hits
    now[0] += 61.0  # a minute on, it is asked again (the server may have been started since)
    book.discover(server.url, "openai/x", timeout=2.0)
    assert len(server.hits) == 2 * hits


def test_a_slow_or_absent_server_costs_at_most_the_timeout(fake: Callable[..., Fake]) -> None:
    slow = fake({("GET", "/v1/models"): lambda _: VLLM_MODELS}, delay=3.0)
    book = WindowBook()
    started = time.monotonic()
    assert book.discover(slow.url, "openai/Qwen/Qwen2.5-7B-Instruct", timeout=0.5) is None
    assert time.monotonic() - started < 1.5
    started = time.monotonic()
    assert book.discover("http://127.0.0.1:9/v1", "openai/x", timeout=0.5) is None  # nobody listens
    assert time.monotonic() - started < 1.0


def test_concurrent_sessions_on_one_endpoint_ask_once(fake: Callable[..., Fake]) -> None:
    server = fake({("GET", "/props"): lambda _: LLAMA_PROPS}, delay=0.2)
    book = WindowBook()
    answers: list[Any] = []
    threads = [
        threading.Thread(target=lambda: answers.append(book.discover(server.url, "openai/s", timeout=2.0)))
        for _ in range(6)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [a.window for a in answers] == [512] * 6
    assert book.asked == 1


def test_an_error_stated_window_is_kept_for_the_endpoint() -> None:
    book = WindowBook()
    book.learn("http://h/v1", "openai/m", 1024)
    found = book.discover("http://h/v1", "openai/m", timeout=0.1)
    assert found is not None and (found.window, found.source) == (1024, "overflow") and book.asked == 0
    book.learn(None, "openai/m", 1024)  # no endpoint: nothing to key it by
    book.learn("http://h/v1", "openai/n", 3)  # no model has a window of 3
    assert book.get("http://h/v1", "openai/n") is None


def test_a_session_starts_with_the_window_its_server_states(rt: Any, fake: Callable[..., Fake]) -> None:
    server = fake({("GET", "/props"): lambda _: LLAMA_PROPS})
    sid = rt.start_session(model="openai/smollm2", api_base=server.url)
    assert rt.context_stats(sid).window == 512
    # configured windows win: the server is not asked
    asked = len(server.hits)
    other = rt.start_session(
        model="openai/other", api_base=server.url, config={"models.context_windows": {"openai/other": 4000}}
    )
    assert rt.context_stats(other).window == 4000 and len(server.hits) == asked
    # and a model litellm knows is not asked about either
    known = rt.start_session(model="openai/gpt-4o", api_base=server.url)
    assert rt.context_stats(known).window == 128_000 and len(server.hits) == asked
    # discovery off: the fallback
    off = rt.start_session(
        model="openai/third", api_base=server.url, config={"models.discover_windows": False}
    )
    assert rt.context_stats(off).window == 128_000 and len(server.hits) == asked


def test_the_servers_tokenizer_counts_where_asked_and_the_counter_falls_back(
    fake: Callable[..., Fake],
) -> None:
    from runtime.config import TokenConfig
    from runtime.gateway import ServerTokenizer
    from runtime.messages import user
    from runtime.tokens import TokenCounter

    server = fake({("POST", "/tokenize"): lambda body: {"tokens": list(range(len(body["content"])))}})
    counter = TokenCounter(
        "openai/smollm2", TokenConfig(server_tokenize=True), tokenize=ServerTokenizer(server.url)
    )
    assert counter.count_text("abcdefghij") == 10  # one token a character: the server's count, not tiktoken's
    plain = TokenCounter("openai/smollm2")
    assert plain.count_text("abcdefghij") < 10
    message = user("hello world")
    assert (
        counter.count_message(message) == plain.count_message(message) - plain.count_text("hello world") + 11
    )
    assert server.hits[-1][2] == {"content": "hello world", "add_special": False}
    # a server that does not answer: counted here, and not asked again for a while
    down = TokenCounter("openai/x", tokenize=ServerTokenizer("http://127.0.0.1:9/v1", timeout=0.5))
    assert down.count_text("abcdefghij") == plain.count_text("abcdefghij")
    started = time.monotonic()
    assert down.count_text("another text") == plain.count_text("another text")
    assert time.monotonic() - started < 0.1


def test_a_session_counts_with_its_servers_tokenizer_when_told(rt: Any, fake: Callable[..., Fake]) -> None:
    server = fake(
        {
            ("GET", "/props"): lambda _: LLAMA_PROPS,
            ("POST", "/tokenize"): lambda body: {"tokens": [0] * (3 * len(body["content"].split()))},
        }
    )
    told = rt.start_session(
        model="openai/smollm2",
        api_base=server.url,
        system_prompt="one two three four",
        config={"tokens.server_tokenize": True},
    )
    plain = rt.start_session(model="openai/smollm2", api_base=server.url, system_prompt="one two three four")
    assert rt.context_stats(told).system_prompt > rt.context_stats(plain).system_prompt
    assert any(path == "/tokenize" for _, path, _ in server.hits)


def test_a_session_without_an_api_base_asks_the_openai_base_url_the_transports_use(
    rt: Any, fake: Callable[..., Fake], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agentcell serve`` and a user's environment name the endpoint in OPENAI_BASE_URL: an ``openai/``
    model unknown to litellm is asked about there (with no key: the environment's is never sent)."""
    server = fake({("GET", "/props"): lambda _: LLAMA_PROPS})
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-the-environments-key")
    sid = rt.start_session(model="openai/smollm2")
    assert rt.context_stats(sid).window == 512
    assert server.hits and all("sk-the-environments-key" not in str(h) for h in server.headers)
