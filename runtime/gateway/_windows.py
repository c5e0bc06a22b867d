"""The context windows of OpenAI-compatible endpoints litellm does not know (design §4.5).

A session on a model nobody's table knows (``openai/smollm2`` at a local llama.cpp server) would otherwise run
with the fallback window (128,000) against a server that holds 2,048. Two ways to the real one:

* **Discovery**: the server is asked once per (api_base, model), with a short timeout, in the dialects the
  common servers speak: llama.cpp's ``/props`` (``n_ctx``, the context of one slot: ``--ctx-size`` divided
  by ``--parallel``), vLLM's and SGLang's ``/v1/models`` (``max_model_len``), OpenRouter's ``/models``
  (``context_length``), LM Studio's ``/api/v0/models`` (``loaded_context_length``, else
  ``max_context_length``) and Ollama's ``/api/show`` (``num_ctx`` from the parameters, else the model's
  ``context_length``). The answer, found or not, is cached: a found window for the process, a miss for a
  minute.
* **Learning**: an overflow error that states the limit (``runtime.context.overflow.stated_window``) is
  recorded here by the session that met it, so the endpoint's later sessions start with it.

The readers (:func:`window_from_models`, :func:`window_from_props`, …) are pure: a parsed JSON body in, a
window or None out. :class:`ServerTokenizer` counts text with llama.cpp's ``/tokenize`` (an option,
``tokens.server_tokenize``). :class:`WindowBook` does the asking, with httpx, from the calling thread (a session being
created, never an actor), and is shared by a runtime's sessions through its gateway.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import msgspec

__all__ = [
    "Discovered",
    "ServerTokenizer",
    "WindowBook",
    "endpoint_of",
    "window_from_lmstudio",
    "window_from_models",
    "window_from_ollama",
    "window_from_props",
]

_MIN: Final = 16
_MAX: Final = 100_000_000
MISS_TTL: Final = 60.0
"""Seconds a failed discovery is remembered (a server started after its first session is found later)."""


class Discovered(msgspec.Struct, frozen=True):
    """A window the book knows and where it came from: ``props``, ``models``, ``lmstudio``, ``ollama``
    (asked) or ``overflow`` (stated by an error)."""

    window: int
    source: str


def _window(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    n = int(value)
    return n if _MIN <= n <= _MAX else None


def _names(model: str) -> list[str]:
    """``model`` and its names without provider prefixes, lower case (``openai/x/y`` → ``x/y``, ``y``)."""
    name = model.strip().lower()
    out = [name]
    while "/" in name:
        name = name.split("/", 1)[1]
        if name:
            out.append(name)
    return out


def _entry(
    entries: Iterable[Any], model: str, key: Callable[[Mapping[str, Any]], str]
) -> Mapping[str, Any] | None:
    """The entry of a model list that names ``model`` (by any of its names), or the only entry there is."""
    listed = [e for e in entries if isinstance(e, Mapping)]
    names = _names(model)
    for name in names:
        for entry in listed:
            if str(key(entry)).strip().lower() == name:
                return entry
    return listed[0] if len(listed) == 1 else None


def window_from_models(body: object, model: str) -> int | None:
    """An OpenAI-style ``/v1/models`` list: vLLM's and SGLang's ``max_model_len``, OpenRouter's
    ``context_length`` (or ``top_provider.context_length``), llama.cpp's ``meta.n_ctx`` (a slot's context,
    in newer servers). ``meta.n_ctx_train`` is the training context, not the server's, and is not read."""
    if not isinstance(body, Mapping) or not isinstance(body.get("data"), list):
        return None
    entry = _entry(body["data"], model, lambda e: e.get("id", ""))
    if entry is None:
        return None
    for key in ("max_model_len", "context_length", "context_window", "max_context_length"):
        found = _window(entry.get(key))
        if found is not None:
            return found
    for nested, key in (("top_provider", "context_length"), ("meta", "n_ctx")):
        inner = entry.get(nested)
        if isinstance(inner, Mapping) and (found := _window(inner.get(key))) is not None:
            return found
    return None


def window_from_props(body: object) -> int | None:
    """llama.cpp's ``/props``: ``default_generation_settings.n_ctx`` (one slot's context), else a top-level
    ``n_ctx`` divided by ``total_slots``."""
    if not isinstance(body, Mapping):
        return None
    settings = body.get("default_generation_settings")
    if isinstance(settings, Mapping):
        found = _window(settings.get("n_ctx"))
        if found is not None:
            return found
    total = _window(body.get("n_ctx"))
    slots = body.get("total_slots")
    if total is not None and isinstance(slots, int) and not isinstance(slots, bool) and slots > 1:
        return _window(total // slots)
    return total


def window_from_lmstudio(body: object, model: str) -> int | None:
    """LM Studio's ``/api/v0/models``: the loaded context of the model, else its maximum."""
    if not isinstance(body, Mapping) or not isinstance(body.get("data"), list):
        return None
    entry = _entry(body["data"], model, lambda e: e.get("id", ""))
    if entry is None:
        return None
    return _window(entry.get("loaded_context_length")) or _window(entry.get("max_context_length"))


def window_from_ollama(body: object) -> int | None:
    """Ollama's ``/api/show``: ``num_ctx`` among the model's parameters (what the server runs it with),
    else ``<architecture>.context_length`` of its model info."""
    if not isinstance(body, Mapping):
        return None
    parameters = body.get("parameters")
    if isinstance(parameters, str):
        for line in parameters.splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[0] == "num_ctx" and parts[1].isdigit():
                found = _window(int(parts[1]))
                if found is not None:
                    return found
    info = body.get("model_info")
    if isinstance(info, Mapping):
        for key, value in info.items():
            if isinstance(key, str) and key.endswith(".context_length"):
                found = _window(value)
                if found is not None:
                    return found
    return None


_PREFIXES: Final = frozenset({"openai", "hosted_vllm", "ollama", "ollama_chat", "lm_studio", "openrouter"})
"""litellm's provider prefixes a server does not know its model by."""


def endpoint_of(model: str, api_base: str | None) -> str | None:
    """Where a model's requests go, for keying its window: the session's ``api_base``, else, for an
    ``openai/`` model, the ``OPENAI_BASE_URL`` (or ``OPENAI_API_BASE``) the transports read; None: a
    provider's own endpoint, whose models litellm knows."""
    if api_base:
        return api_base
    if model.startswith("openai/"):
        return os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE") or None
    return None


def _root(api_base: str) -> str:
    """The server's root: ``api_base`` without a trailing ``/v1`` (llama.cpp's, Ollama's and LM Studio's own
    routes live beside the OpenAI-compatible ones)."""
    base = api_base.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


class WindowBook:
    """The windows of (api_base, model) pairs: learned from overflows, or asked of the server once."""

    def __init__(self, *, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._known: dict[tuple[str, str], Discovered] = {}
        self._misses: dict[tuple[str, str], float] = {}  # when a failed discovery may be tried again
        self._asking: dict[tuple[str, str], threading.Event] = {}
        self._clock = clock
        self.asked = 0  # discoveries made (each is one to four short requests)

    def get(self, api_base: str | None, model: str) -> Discovered | None:
        """What the book knows of the pair, without asking anyone."""
        if api_base is None:
            return None
        return self._known.get((api_base, model))

    def learn(self, api_base: str | None, model: str, window: int) -> None:
        """Record a window an error stated: the endpoint's later sessions start with it."""
        if api_base is not None and _window(window) is not None:
            with self._lock:
                self._known[(api_base, model)] = Discovered(window, "overflow")
                self._misses.pop((api_base, model), None)

    def discover(
        self, api_base: str, model: str, *, timeout: float, api_key: str | None = None
    ) -> Discovered | None:
        """The pair's window: known already, or asked of the server now (at most about ``timeout`` seconds,
        once; a concurrent caller for the same pair waits for that answer instead of asking again)."""
        key = (api_base, model)
        while True:
            with self._lock:
                known = self._known.get(key)
                if known is not None:
                    return known
                if self._misses.get(key, 0.0) > self._clock():
                    return None
                pending = self._asking.get(key)
                if pending is None:
                    done = self._asking[key] = threading.Event()
                    break
            if not pending.wait(timeout * 2):
                return None
        found: Discovered | None = None
        try:
            found = self._ask(api_base, model, timeout, api_key)
        finally:
            with self._lock:
                if found is not None:
                    self._known.setdefault(key, found)
                else:
                    self._misses[key] = self._clock() + MISS_TTL
                del self._asking[key]
                self.asked += 1
            done.set()
        return self._known.get(key, found)

    def _ask(self, api_base: str, model: str, timeout: float, api_key: str | None) -> Discovered | None:
        import httpx

        root = _root(api_base)
        deadline = time.monotonic() + timeout
        prefix, _, rest = model.partition("/")
        served = rest if rest and prefix in _PREFIXES else model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        probes: tuple[tuple[str, str, str, Callable[[object], int | None]], ...] = (
            ("models", "GET", api_base.rstrip("/") + "/models", lambda b: window_from_models(b, model)),
            ("props", "GET", root + "/props", window_from_props),
            ("lmstudio", "GET", root + "/api/v0/models", lambda b: window_from_lmstudio(b, model)),
            ("ollama", "POST", root + "/api/show", window_from_ollama),
        )
        try:
            with httpx.Client(trust_env=False, follow_redirects=False, headers=headers) as client:
                for source, method, url, read in probes:
                    left = deadline - time.monotonic()
                    if left <= 0.05:
                        return None
                    try:
                        response = client.request(
                            method,
                            url,
                            json={"model": served} if method == "POST" else None,
                            timeout=httpx.Timeout(left),
                        )
                    except httpx.ConnectError:
                        return None  # nobody listens: the other probes would not fare better
                    except httpx.HTTPError:
                        continue
                    if response.status_code != 200 or len(response.content) > 8 * 1024 * 1024:
                        continue
                    try:
                        window = read(response.json())
                    except ValueError:
                        continue
                    if window is not None:
                        return Discovered(window, source)
        except Exception:  # discovery is a nicety: a surprise here must never fail a session's creation
            return None
        return None


class ServerTokenizer:
    """Counts a text with llama.cpp's own tokenizer (``POST /tokenize``, ``tokens.server_tokenize``): exact
    where tiktoken is a stand-in. ``None`` when the server does not answer in ``timeout`` (it is then not
    asked again for a minute, and the counter counts on its own)."""

    def __init__(
        self, api_base: str, *, timeout: float = 2.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.url = _root(api_base) + "/tokenize"
        self.timeout = timeout
        self._clock = clock
        self._resting_until = 0.0
        self._client: Any = None
        self._lock = threading.Lock()

    def __call__(self, text: str) -> int | None:
        if self._clock() < self._resting_until:
            return None
        import httpx

        try:
            with self._lock:
                if self._client is None:
                    self._client = httpx.Client(trust_env=False, timeout=self.timeout)
                client = self._client
            response = client.post(self.url, json={"content": text, "add_special": False})
            tokens = response.json().get("tokens") if response.status_code == 200 else None
            if isinstance(tokens, list):
                return len(tokens)
        except Exception:
            pass
        self._resting_until = self._clock() + MISS_TTL
        return None
