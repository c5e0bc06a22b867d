"""Which transport serves a call, and where it goes (design §3.2).

litellm stays the reference: the native ``openai_compat`` transport serves a call only where it sends what
litellm would send. A model is resolved once (per model name, ``api_base`` and transport setting) with
litellm's own provider resolution (``litellm.get_llm_provider``), and the answer is cached:

- ``gateway.transport = "litellm"``: every call goes through litellm.
- ``"auto"`` (the default): the native Anthropic transport for ``anthropic/`` models (Anthropic's Messages
  API, :mod:`runtime.gateway.transports.anthropic`); the native chat-completions transport for the providers
  of :data:`DIALECTS` -- ``openai/``
  models (with or without ``api_base``: vLLM, Ollama's OpenAI API, llama.cpp's server, LM Studio, the local
  provider...) and the OpenAI-compatible providers whose requests litellm shapes in a way written down here
  (and checked against litellm's own requests by the tests); litellm for every other provider.
- ``"openai_compat"``: the native transport for every provider litellm resolves to an OpenAI-compatible
  endpoint, those it reshapes in ways not written down here too; litellm for the others (Anthropic,
  Bedrock, Vertex/Gemini, Azure, Cohere...), which do not speak OpenAI chat completions.

Whatever the setting, a call the native transport cannot make the same way goes to litellm: an in-process
``mock_response``, ``extra`` parameters (litellm maps them per provider), a ``temperature`` the model takes
only in litellm's mapping (OpenAI's reasoning models), models litellm serves through OpenAI's Responses API,
providers without a known endpoint, and endpoints the environment sends through a proxy
(``HTTPS_PROXY``...). The :class:`Route` says which transport and why.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from runtime.gateway._anthropic_body import declined
from runtime.gateway._cost import Prices, prices_for
from runtime.gateway._models import CompletionRequest, TransportMode
from runtime.messages import ImagePart, Message

_log = logging.getLogger("agentcell.gateway")

LITELLM: Final = "litellm"
OPENAI_COMPAT: Final = "openai_compat"
ANTHROPIC: Final = "anthropic"
ANTHROPIC_VERSION: Final = "2023-06-01"


class Dialect(msgspec.Struct, frozen=True, kw_only=True):
    """How litellm shapes a chat-completions request for one provider: what the native transport copies."""

    reasoning: bool = True
    """Assistant messages keep ``reasoning_content`` (Groq's endpoint rejects it: litellm strips it)."""
    thinking_blocks: bool = True
    """Assistant messages keep ``thinking_blocks`` (vLLM and Together's do not: litellm strips them)."""
    body: Mapping[str, Any] = msgspec.field(default_factory=dict)
    """Fields litellm adds to every request body (OpenRouter's ``usage: {include: true}``)."""
    stream_false: bool = False
    """A call that is not streamed says ``"stream": false`` (litellm's HTTP handler writes it; its OpenAI
    client path leaves it out)."""
    images: bool = True
    """Images go as they are (DeepSeek's do not: litellm collapses a message with images to its text unless
    the model takes images, so such calls go to litellm)."""


PLAIN: Final = Dialect()

DIALECTS: Final[Mapping[str, Dialect]] = {
    # The request body litellm sends is exactly the OpenAI one.
    "openai": PLAIN,
    "deepseek": Dialect(images=False, stream_false=True),
    "xai": Dialect(stream_false=True),
    "lm_studio": PLAIN,
    "llamafile": PLAIN,
    "litellm_proxy": PLAIN,
    "moonshot": PLAIN,
    "dashscope": PLAIN,
    "nebius": PLAIN,
    "novita": PLAIN,
    "zai": PLAIN,
    "baseten": PLAIN,
    "lambda_ai": PLAIN,
    "meta_llama": PLAIN,
    "volcengine": PLAIN,
    # litellm drops reasoning these endpoints do not take back.
    "hosted_vllm": Dialect(thinking_blocks=False, stream_false=True),
    "together_ai": Dialect(thinking_blocks=False, stream_false=True),
    "groq": Dialect(reasoning=False, thinking_blocks=False),
    # OpenRouter: litellm always asks for the usage with its cost, and names its app in two headers.
    "openrouter": Dialect(body={"usage": {"include": True}}, stream_false=True),
}
"""The providers ``auto`` sends over the native transport, and how litellm shapes their requests."""

_NOT_CHAT_COMPLETIONS: Final = frozenset(
    {"text-completion-openai", "azure", "azure_text", "ollama", "ollama_chat"}
)


class Route(msgspec.Struct, frozen=True, kw_only=True):
    """Where a call goes. For the native transport: the endpoint, the model name it takes, and how to
    shape the request. ``api_key`` is the key found in the environment (the request's own comes first);
    it is never shown by ``repr``."""

    transport: str
    provider: str | None = None
    reason: str = ""
    model: str = ""
    url: str = ""
    base_url: str = ""
    api_key: str | None = None
    headers: Mapping[str, str] = msgspec.field(default_factory=dict)
    dialect: Dialect = PLAIN
    max_tokens_param: str | None = "max_tokens"
    """The body field ``max_tokens`` goes in (``max_completion_tokens`` for OpenAI's reasoning models);
    None when only litellm's mapping can send it."""
    temperature: bool = True
    """Whether a ``temperature`` goes as it is (else only litellm's mapping can send it)."""
    default_max_tokens: int = 4_096
    """The ``max_tokens`` a request without one is sent with (Anthropic requires it: litellm's default for
    the model)."""
    prices: Prices | None = None

    def __repr__(self) -> str:
        key = "'***'" if self.api_key else "None"
        return (
            f"Route(transport={self.transport!r}, provider={self.provider!r}, model={self.model!r}, "
            f"url={self.url!r}, api_key={key}, reason={self.reason!r})"
        )

    __str__ = __repr__

    def __rich_repr__(self) -> Any:
        yield "transport", self.transport
        yield "provider", self.provider
        yield "url", self.url
        yield "api_key", "***" if self.api_key else None


class _Resolved(msgspec.Struct, frozen=True):
    native: Route | None
    fallback: Route


class Router:
    """Resolves each request to a :class:`Route`, once per (model, ``api_base``, transport setting).

    :meth:`cached` answers from the cache without importing anything; :meth:`route` resolves (it may import
    litellm: call it off the I/O loop the first time).
    """

    def __init__(self) -> None:
        self._cache: dict[tuple[str, str | None, str], _Resolved] = {}
        self._lock = threading.Lock()

    def cached(self, request: CompletionRequest) -> Route | None:
        """The request's route if its model was resolved already, else None."""
        resolved = self._cache.get((request.model, request.api_base, request.transport))
        return None if resolved is None else _choose(resolved, request)

    def route(self, request: CompletionRequest) -> Route:
        """The request's route, resolving its model first if needed."""
        route = self.cached(request)
        if route is not None:
            return route
        key = (request.model, request.api_base, request.transport)
        resolved = resolve(request.model, request.api_base, request.transport)
        with self._lock:
            self._cache.setdefault(key, resolved)
        return _choose(resolved, request)


def _choose(resolved: _Resolved, request: CompletionRequest) -> Route:
    native = resolved.native
    if native is None:
        return resolved.fallback
    if request.mock_response is not None:
        return msgspec.structs.replace(resolved.fallback, reason="mock_response: litellm's in-process fake")
    if request.extra:
        return msgspec.structs.replace(resolved.fallback, reason="extra parameters: litellm maps them")
    if request.max_tokens is not None and native.max_tokens_param is None:
        return msgspec.structs.replace(resolved.fallback, reason="max_tokens: litellm maps it for this model")
    if request.temperature is not None and not native.temperature:
        return msgspec.structs.replace(
            resolved.fallback, reason="temperature: litellm maps it for this model"
        )
    if native.transport == ANTHROPIC and (why := declined(request)) is not None:
        return msgspec.structs.replace(resolved.fallback, reason=why)
    if not native.dialect.images and _has_images(request):
        return msgspec.structs.replace(
            resolved.fallback, reason="images: litellm reshapes them for this provider"
        )
    return native


def _has_images(request: CompletionRequest) -> bool:
    for message in request.messages:
        if isinstance(message, Message):
            if any(isinstance(part, ImagePart) for part in message.parts):
                return True
        elif isinstance(message.get("content"), list):
            return True
    return False


def resolve(model: str, api_base: str | None, mode: TransportMode) -> _Resolved:
    """Resolve ``model`` with litellm's provider resolution: the native route (or None) and litellm's."""
    from runtime.gateway._litellm import load_litellm

    litellm = load_litellm()
    fallback = Route(
        transport=LITELLM,
        provider=model.split("/", 1)[0] if "/" in model else None,
        prices=prices_for(litellm, model),
    )
    try:
        upstream, provider, env_key, resolved_base = litellm.get_llm_provider(model, api_base=api_base)
    except Exception as exc:  # litellm does not know the provider: it will say so on the call
        return _Resolved(
            None, msgspec.structs.replace(fallback, reason=f"litellm cannot resolve it: {exc}"[:200])
        )
    fallback = msgspec.structs.replace(fallback, provider=provider)

    def litellm_only(reason: str) -> _Resolved:
        return _Resolved(None, msgspec.structs.replace(fallback, reason=reason))

    if mode == LITELLM:
        return litellm_only("the litellm transport was asked for")
    if provider == "anthropic" and mode == "auto":
        return _anthropic(litellm, upstream, api_base, fallback)
    dialect = DIALECTS.get(provider)
    if dialect is None:
        if mode != OPENAI_COMPAT or not _speaks_chat_completions(litellm, provider):
            return litellm_only(f"{provider}: litellm's own request shape")
        dialect = PLAIN
    info = litellm.model_cost.get(model) or litellm.model_cost.get(upstream) or {}
    if info.get("mode") == "responses":
        return litellm_only(f"{upstream}: litellm serves it through the Responses API")
    base = _base_url(litellm, provider, api_base or resolved_base)
    if not base:
        return litellm_only(f"{provider}: no endpoint known without litellm")
    if not base.startswith(("http://", "https://")):
        return litellm_only(f"{base}: not an http(s) endpoint")
    proxy = _proxy_for(base)
    if proxy:
        return litellm_only(f"a proxy is configured for {proxy}: litellm's HTTP client goes through it")
    headers: dict[str, str] = {}
    api_key = env_key or litellm.api_key
    if provider == "openai":
        api_key = api_key or litellm.openai_key or os.environ.get("OPENAI_API_KEY")
    elif provider == "openrouter":
        api_key = (
            api_key
            or litellm.openrouter_key
            or os.environ.get("OPENROUTER_API_KEY")
            or os.environ.get("OR_API_KEY")
        )
        headers = {
            "HTTP-Referer": os.environ.get("OR_SITE_URL") or "https://litellm.ai",
            "X-Title": os.environ.get("OR_APP_NAME") or "liteLLM",
        }
    max_tokens_param, temperature = _parameters(litellm, upstream, provider)
    native = Route(
        transport=OPENAI_COMPAT,
        provider=provider,
        reason="auto: a native provider" if mode == "auto" else "the openai_compat transport was asked for",
        model=upstream,
        url=base.rstrip("/") + "/chat/completions",
        base_url=base,
        api_key=api_key or None,
        headers=headers,
        dialect=dialect,
        max_tokens_param=max_tokens_param,
        temperature=temperature,
        prices=prices_for(litellm, upstream, provider) or fallback.prices,
    )
    return _Resolved(native, fallback)


def _anthropic(litellm: Any, model: str, api_base: str | None, fallback: Route) -> _Resolved:
    """The native route of an ``anthropic/`` model: Anthropic's Messages API where litellm would send it."""
    from litellm.litellm_core_utils.url_utils import ensure_api_route

    base = (
        api_base
        or litellm.api_base
        or os.environ.get("ANTHROPIC_API_BASE")
        or os.environ.get("ANTHROPIC_BASE_URL")
        or "https://api.anthropic.com/v1/messages"
    )
    if os.environ.get("LITELLM_ANTHROPIC_DISABLE_URL_SUFFIX", "").lower() not in ("1", "true"):
        base = ensure_api_route(base, "v1/messages")
    if not base.startswith(("http://", "https://")):
        return _Resolved(None, msgspec.structs.replace(fallback, reason=f"{base}: not an http(s) endpoint"))
    proxy = _proxy_for(base)
    if proxy:
        reason = f"a proxy is configured for {proxy}: litellm's HTTP client goes through it"
        return _Resolved(None, msgspec.structs.replace(fallback, reason=reason))
    api_key = litellm.anthropic_key or litellm.api_key or os.environ.get("ANTHROPIC_API_KEY")
    max_tokens_param, temperature = _parameters(litellm, model, "anthropic")
    try:
        default_max_tokens = int(litellm.AnthropicConfig.get_config(model=model)["max_tokens"])
    except Exception:  # litellm's own fallback, whatever its config says
        default_max_tokens = int(litellm.AnthropicConfig.get_max_tokens_for_model(model))
    native = Route(
        transport=ANTHROPIC,
        provider="anthropic",
        reason="auto: Anthropic's Messages API",
        model=model,
        url=base,
        base_url=base,
        api_key=api_key or None,
        headers={"anthropic-version": ANTHROPIC_VERSION},
        max_tokens_param=max_tokens_param,
        temperature=temperature,
        default_max_tokens=default_max_tokens,
        prices=prices_for(litellm, model, "anthropic") or fallback.prices,
    )
    return _Resolved(native, fallback)


def _speaks_chat_completions(litellm: Any, provider: str) -> bool:
    if provider in _NOT_CHAT_COMPLETIONS:
        return False
    if provider in ("openai", "custom_openai", "openrouter", "mistral", "codestral", "fireworks_ai"):
        return True
    if provider in litellm.openai_compatible_providers:
        return True
    try:
        from litellm.llms.openai_like.json_loader import JSONProviderRegistry

        return bool(JSONProviderRegistry.exists(provider))
    except Exception:
        return False


def _base_url(litellm: Any, provider: str, given: str | None) -> str | None:
    """The endpoint's base URL, found where litellm finds it."""
    if given:
        return given
    if provider == "openai":
        return (
            litellm.api_base
            or os.environ.get("OPENAI_BASE_URL")
            or os.environ.get("OPENAI_API_BASE")
            or "https://api.openai.com/v1"
        )
    if provider == "openrouter":
        return litellm.api_base or os.environ.get("OPENROUTER_API_BASE") or "https://openrouter.ai/api/v1"
    return None


def _proxy_for(url: str) -> str | None:
    """The host of ``url`` if the environment names a proxy for it (``HTTPS_PROXY``, ``NO_PROXY``...)."""
    import urllib.request
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    proxies = urllib.request.getproxies()
    if not (proxies.get(parts.scheme) or proxies.get("all")):
        return None
    host = parts.hostname or ""
    return None if urllib.request.proxy_bypass(host) else host


_PROBE_TOKENS: Final = 1_024
_PROBE_TEMPERATURE: Final = 0.7


def _parameters(litellm: Any, model: str, provider: str) -> tuple[str | None, bool]:
    """Where litellm puts ``max_tokens`` for this model (None: somewhere the native transport does not
    copy), and whether a ``temperature`` goes as it is: litellm's own parameter mapping, asked once."""
    from litellm.utils import get_optional_params

    def mapped(**params: Any) -> dict[str, Any] | None:
        try:
            out = get_optional_params(model=model, custom_llm_provider=provider, **params)
        except Exception:
            return None
        return {
            k: v for k, v in out.items() if k not in ("stream", "stream_options") and (v or k != "extra_body")
        }

    tokens = mapped(max_tokens=_PROBE_TOKENS)
    max_tokens_param = None
    if tokens is not None and len(tokens) == 1:
        ((name, value),) = tokens.items()
        if value == _PROBE_TOKENS and name in ("max_tokens", "max_completion_tokens"):
            max_tokens_param = name
    temperature = mapped(temperature=_PROBE_TEMPERATURE) == {"temperature": _PROBE_TEMPERATURE}
    return max_tokens_param, temperature
