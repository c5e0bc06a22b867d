"""What both of the local provider's endpoints (chat completions, Anthropic's Messages) answer with: JSON
responses, error responses, and the status an injected fault is logged with."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.responses import Response

from runtime.dialects._base import ErrorResponse
from runtime.provider.script import Fault

_json = msgspec.json.Encoder()

_FAULT_STATUSES = {"rate_limit": 429, "server_error": 500, "auth": 401, "overflow": 400, "stream_error": 200}


def json_response(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(_json.encode(body), status_code=status, media_type="application/json", headers=headers)


def error_response(error: ErrorResponse) -> Response:
    return json_response(error.status, error.body, error.headers)


def fault_status(fault: Fault, *, overloaded: int) -> int:
    """The HTTP status ``fault`` answers with; ``overloaded`` is the endpoint's (OpenAI 503, Anthropic 529)."""
    if fault.status:
        return fault.status
    return overloaded if fault.kind == "overloaded" else _FAULT_STATUSES.get(fault.kind, 0)
