"""The transport interface: how the gateway makes one attempt of a call, whatever speaks to the provider.

The gateway owns everything around an attempt (the route, retries with backoff, cancellation, stall
watch, delivering the result); a transport makes one attempt and either returns the assistant message
(with its usage) or raises. It reports each streamed piece through ``call.on_delta``, the response's
headers through ``call.response_started()`` and each piece of data through ``call.activity()``, and says
what its library's exceptions are by their types in :meth:`Transport.error_kind`; :meth:`Transport.classify`
applies the shared rules (status, overflow) to that. A new transport is one module here.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, ClassVar, Protocol

from runtime.gateway._errors import classify_error
from runtime.gateway._models import CompletionRequest, Delta, ErrorKind, ProviderError

if TYPE_CHECKING:
    from runtime.gateway._routing import Route
    from runtime.messages import Message


class Attempt(Protocol):
    """What a transport sees of the call it makes an attempt of."""

    @property
    def request(self) -> CompletionRequest: ...

    @property
    def on_delta(self) -> Callable[[Delta], object] | None: ...

    def response_started(self) -> None:
        """The response's headers arrived (not an answer yet: the first-byte limit still runs)."""

    def activity(self) -> None:
        """Data of the answer arrived: a chunk, or the whole body (resets the stall watch). Keep-alives
        (SSE comments) are not data."""

    def received_headers(self, headers: Mapping[str, str]) -> None:
        """The answer's headers (its rate limits feed the call's capacity pool, design §3.11)."""


class Transport(abc.ABC):
    """One way of talking to providers. Lives on the gateway's I/O loop; not thread-safe."""

    name: ClassVar[str]

    @abc.abstractmethod
    async def attempt(self, call: Attempt, route: Route) -> Message:
        """Make one attempt of ``call`` over ``route``; the assistant message, or an exception."""

    def classify(self, exc: BaseException, route: Route) -> ProviderError:
        """The kind of failure ``exc`` is (overflow, rate limit, transient, auth, ...): what its type says
        (:meth:`error_kind`), then the status, overflow wordings and message (the shared rules)."""
        return classify_error(exc, provider=route.provider, kind=self.error_kind(exc))

    def error_kind(self, exc: BaseException) -> ErrorKind | None:
        """What the type of ``exc`` (an exception of this transport's library) says it is, or None."""
        return None

    async def aclose(self) -> None:  # noqa: B027 - optional: a transport without connections has none to close
        """Close what the transport keeps open (connections); called on the I/O loop as it stops."""
