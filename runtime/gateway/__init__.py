"""The gateway: every provider call of the runtime, on one asyncio loop thread (design §3.2, 3.3, 3.7).

Actors hand a :class:`CompletionRequest` to :meth:`Gateway.complete`, which returns at once with a
:class:`CallHandle`; the call runs on the :class:`IoLoop` over a transport, and its :class:`CompletionResult`
(the assistant message with normalized usage, or a classified :class:`ProviderError`) comes back through a
callback, exactly once.

Two transports make the calls (``transports/``): the native ``openai_compat`` one (keep-alive HTTP/1.1 pools,
the request and the server-sent events encoded and decoded with msgspec) for endpoints that speak OpenAI chat
completions, and ``litellm`` for every provider; ``gateway.transport`` and :mod:`runtime.gateway._routing`
decide which serves a call. Both behave alike: the same deltas, usage, error kinds, retries, cancel and cost.

Layout, one concern a module::

    _loop.py        IoLoop: the asyncio thread every call runs on
    _models.py      CompletionRequest, CompletionResult, ProviderError, Delta, RetryInfo
    _errors.py      classify_error: provider failures into error kinds (one classifier for all transports)
    _retry.py       backoff with jitter, honouring retry-after
    _admission.py   AdmissionControl: each call waits for its capacity pool (runtime.capacity) on the loop
    _usage.py       usage of any response shape, normalized
    _cost.py        prices from litellm's map, read once per model; a call's cost
    _stream.py      StreamAssembler: the assistant message from streamed pieces; stop reasons
    _convert.py     our messages in the OpenAI chat format
    _routing.py     which transport serves a call, where it goes, how its request is shaped
    _gateway.py     Gateway, CallHandle, complete_sync: routing, retries, cancel, stall watch, delivery
    _windows.py     WindowBook: the context windows of endpoints litellm does not know, asked or learned
    transports/     base.py (the interface), litellm.py, openai_compat.py (+ _http.py, its HTTP/1.1 client)
"""

from runtime.gateway._admission import WAIT_BUCKETS, AdmissionControl, PoolSnapshot, QueueTimeout
from runtime.gateway._caching import cache_hints, cache_style
from runtime.gateway._convert import accepts_reasoning, to_provider_messages
from runtime.gateway._errors import classify_error, clean_error_message, retry_after_seconds
from runtime.gateway._gateway import CallHandle, Gateway, complete_sync
from runtime.gateway._litellm import load_litellm
from runtime.gateway._loop import IoLoop
from runtime.gateway._models import (
    RETRYABLE_KINDS,
    Admission,
    CacheHints,
    CompletionRequest,
    CompletionResult,
    Delta,
    ErrorKind,
    ProviderError,
    RetryInfo,
    TransportMode,
)
from runtime.gateway._retry import MAX_HONOURED_RETRY_AFTER, backoff_delay
from runtime.gateway._routing import DIALECTS, Dialect, Route
from runtime.gateway._stream import StreamAssembler, message_from_response, stop_reason
from runtime.gateway._usage import normalize_usage
from runtime.gateway._windows import Discovered, ServerTokenizer, WindowBook, endpoint_of
from runtime.gateway.transports.litellm import build_call_kwargs

__all__ = [
    "DIALECTS",
    "MAX_HONOURED_RETRY_AFTER",
    "RETRYABLE_KINDS",
    "WAIT_BUCKETS",
    "Admission",
    "AdmissionControl",
    "CacheHints",
    "CallHandle",
    "CompletionRequest",
    "CompletionResult",
    "Delta",
    "Dialect",
    "Discovered",
    "ErrorKind",
    "Gateway",
    "IoLoop",
    "PoolSnapshot",
    "ProviderError",
    "QueueTimeout",
    "RetryInfo",
    "Route",
    "ServerTokenizer",
    "StreamAssembler",
    "TransportMode",
    "WindowBook",
    "accepts_reasoning",
    "backoff_delay",
    "build_call_kwargs",
    "cache_hints",
    "cache_style",
    "classify_error",
    "clean_error_message",
    "complete_sync",
    "endpoint_of",
    "load_litellm",
    "message_from_response",
    "normalize_usage",
    "retry_after_seconds",
    "stop_reason",
    "to_provider_messages",
]
