"""The door of a server with tenants (:mod:`runtime.apps.tenants`): an ASGI middleware in place of the
single bearer token.

Every request needs a token the tenants file or the server knows (401 otherwise). The admin token (the
server's own) goes through as in a server without tenants. A tenant's request is held to what it owns:

- a session, response or conversation id of another tenant (in the path, a ``session`` filter, a
  ``Last-Event-ID`` cursor, a ``previous_response_id`` or ``conversation``) is answered 404, as an id that
  does not exist; listings (``GET /sessions``, ``/overview``) and event streams show only its own sessions
  (a stream's frames of other sessions are dropped, its cursors cut to its own);
- quotas: a new session past ``max_sessions``, a turn past ``max_concurrent_turns``, ``max_tokens_per_day``
  or ``max_spend_per_day`` is a 429 naming the quota; a model or profile it may not use a 403;
- ``/metrics`` and ``/audit`` are the admin's; ``GET /usage`` is the tenant's own usage (the admin's: every
  tenant's).

What a tenant creates becomes its own when the server answers it; who created, resumed and deleted what
is written to the audit log.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final

import msgspec

from runtime.apps.tenants import ADMIN, Tenants

__all__ = ["TenantGate"]

ErrorBody = Callable[[Any, int, str], bytes]

_SESSION_PATH: Final = re.compile(r"^/sessions/([^/]+)(/[a-z]+)?(?:/[^/]+)?$")  # (.../turns/<prompt id>)
_RESPONSE_PATH: Final = re.compile(r"^/v1/responses/([^/]+)(/[a-z_]+)?$")
_CONVERSATION_PATH: Final = re.compile(r"^/v1/conversations/([^/]+)(/.*)?$")
_READS_BODY: Final = frozenset({"/v1/responses", "/v1/responses/compact", "/v1/responses/input_tokens"})
_RESPONSE_ID: Final = re.compile(rb'"id":\s*"(resp_[0-9a-f]{32})"')
_TURNS: Final = {"prompt"}


class TenantGate:
    """ASGI middleware: identity, ownership and quotas for every request (see the module docstring)."""

    def __init__(
        self,
        app: Any,
        tenants: Tenants,
        runtime: Any,
        *,
        public: frozenset[str],
        error_body: ErrorBody,
        limit: int,
    ) -> None:
        self.app = app
        self.tenants = tenants
        self.runtime = runtime
        self.public = public
        self.error_body = error_body
        self.limit = limit

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or (scope["method"] == "GET" and scope["path"] in self.public):
            await self.app(scope, receive, send)
            return
        given = next((v for k, v in scope["headers"] if k == b"authorization"), b"")
        scheme, _, credentials = given.partition(b" ")
        who = self.tenants.identify(credentials)
        if who is None or scheme.lower() != b"bearer":
            await self._error(
                send, scope, 401, "missing or wrong bearer token", [(b"www-authenticate", b"Bearer")]
            )
            return
        path, method = scope["path"], scope["method"]
        if path == "/usage" and method == "GET":
            usage = (
                {"tenants": [self.tenants.usage(t) for t in sorted(self.tenants.quotas)]}
                if who == ADMIN
                else self.tenants.usage(who)
            )
            await _json(send, 200, usage)
            return
        if path == "/audit" and method == "GET":
            if who != ADMIN:
                await self._error(send, scope, 403, "the audit log is the admin's")
                return
            await _json(send, 200, {"entries": self.tenants.audit_tail()})
            return
        if who == ADMIN:
            await self._audited(scope, receive, send, who)
            return
        await self._tenant(scope, receive, send, who)

    # -- a tenant's request ---------------------------------------------------------------------------
    async def _tenant(self, scope: Any, receive: Any, send: Any, who: str) -> None:
        path, method = scope["path"], scope["method"]
        if path == "/metrics":
            await self._error(send, scope, 403, "/metrics is the admin's on a server with tenants")
            return
        match = _SESSION_PATH.match(path)
        if match is not None:
            sid, action = match.group(1), (match.group(2) or "").lstrip("/")
            if self.tenants.owner(sid) != who:
                await self._error(send, scope, 404, f"no session {sid!r}")
                return
            if method == "POST" and action in _TURNS:
                why = self.tenants.refusal(who, turn=True)
                if why:
                    await self._error(send, scope, 429, why)
                    return
            if method == "POST" and action == "model":
                body, receive = await self._body(receive)
                why = self.tenants.model_refusal(who, _field(body, "model"))
                if why:
                    await self._error(send, scope, 403, why)
                    return
            await self._audited(scope, receive, send, who)
            return
        if path == "/sessions" and method == "POST":
            body, receive = await self._body(receive)
            data = _object(body)
            model = data.get("model") or self.runtime.config.agent.model
            models = [model] + [
                p.get("model") for p in (data.get("agents") or {}).values() if isinstance(p, dict)
            ]
            why = self.tenants.refusal(who, session=True) or next(
                (r for m in models if m and (r := self.tenants.model_refusal(who, m))), None
            )
            if why:
                await self._error(send, scope, 429 if why.startswith("quota reached") else 403, why)
                return
            await self._audited(scope, receive, send, who)
            return
        if path in ("/sessions", "/overview") and method == "GET":
            await self.app(scope, receive, _Filtered(send, lambda item: self._mine(item, who), "sessions"))
            return
        if path == "/events":
            await self._events(scope, receive, send, who)
            return
        if path.startswith("/v1/"):
            await self._responses(scope, receive, send, who)
            return
        await self.app(scope, receive, send)

    def _mine(self, item: Any, who: str) -> bool:
        return isinstance(item, dict) and self.tenants.owner(str(item.get("id"))) == who

    async def _events(self, scope: Any, receive: Any, send: Any, who: str) -> None:
        from urllib.parse import parse_qs

        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        named = [s.strip() for v in query.get("session", []) for s in v.split(",") if s.strip()]
        last = next((v for k, v in scope["headers"] if k == b"last-event-id"), b"").decode("latin-1")
        last = last or (query.get("last_event_id") or [""])[0]
        cursor = [part.strip().rpartition(":")[0] for part in last.split(",") if part.strip()]
        others = [s for s in named + cursor if self.tenants.owner(s) != who]
        if others:
            await self._error(send, scope, 404, f"no session {', '.join(map(repr, others))}")
            return
        await self.app(scope, receive, _EventFilter(send, lambda sid: self.tenants.owner(sid) == who))

    async def _responses(self, scope: Any, receive: Any, send: Any, who: str) -> None:
        path, method = scope["path"], scope["method"]
        for pattern in (_RESPONSE_PATH, _CONVERSATION_PATH):
            match = pattern.match(path)
            if match is None or path in _READS_BODY:
                continue
            if self.tenants.owner(match.group(1)) != who:
                await self._error(send, scope, 404, f"No item with id '{match.group(1)}' found.")
                return
            if method == "DELETE" and not match.group(2):
                await self.app(scope, receive, _Audit(send, self.tenants, who, "delete", match.group(1)))
                return
        if path in _READS_BODY and method == "POST":  # (a response id or conversation named in the body)
            body, receive = await self._body(receive)
            data = _object(body)
            previous = data.get("previous_response_id")
            conversation = data.get("conversation")
            if isinstance(conversation, dict):
                conversation = conversation.get("id")
            for item in (previous, conversation):
                if isinstance(item, str) and self.tenants.owner(item) != who:
                    await self._error(send, scope, 404, f"No item with id '{item}' found.")
                    return
            model = data.get("model")
            profile = isinstance(model, str) and model in getattr(self.runtime, "agents", {})
            why = self.tenants.model_refusal(who, model, profile=profile) or self.tenants.refusal(
                who, turn=path != "/v1/responses/input_tokens"
            )
            if why:
                await self._error(send, scope, 429 if why.startswith("quota reached") else 403, why)
                return
            await self.app(scope, receive, _Claim(send, self, who, _RESPONSE_ID))
            return
        if path == "/v1/conversations" and method == "POST":
            await self.app(
                scope, receive, _Claim(send, self, who, re.compile(rb'"id":\s*"(conv_[0-9a-f]{32})"'))
            )
            return
        await self.app(scope, receive, send)

    def claim(self, item: str, who: str) -> None:
        """``item`` (a new response or conversation) is ``who``'s, and so is a session a response started."""
        self.tenants.own(item, who)
        if item.startswith("resp_"):
            from runtime.apps.responses.records import Records

            record = Records(self.runtime.sessions_path).load_response(item)
            if record is not None and record.session_id and self.tenants.owner(record.session_id) is None:
                self.tenants.own(record.session_id, who)

    # -- helpers ------------------------------------------------------------------------------------
    async def _audited(self, scope: Any, receive: Any, send: Any, who: str) -> None:
        """Pass the request on; for a create, resume or delete: record what it made and write the audit."""
        path, method = scope["path"], scope["method"]
        action = None
        match = _SESSION_PATH.match(path)
        if path == "/sessions" and method == "POST":
            action = "create"
        elif match is not None and method == "DELETE" and not match.group(2):
            action = "delete"
        elif match is not None and match.group(2) == "/resume":
            action = "resume"
        if action is None:
            await self.app(scope, receive, send)
            return
        status = 0
        chunks: list[bytes] = []

        async def watch(message: Any) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and action == "create":
                chunks.append(message.get("body", b""))
            await send(message)

        await self.app(scope, receive, watch)
        target = match.group(1) if match is not None else ""
        if action == "create" and status == 201:
            target = str(json.loads(b"".join(chunks)).get("id", ""))
            if who != ADMIN:
                self.tenants.own(target, who)
        if action == "delete" and status == 200:
            self.tenants.disown(target)
        self.tenants.audit(who if who != ADMIN else "admin", action, target, status)

    async def _body(self, receive: Any) -> tuple[bytes, Any]:
        """The request's body (at most the server's limit; beyond it left for the route to refuse) and a
        ``receive`` that gives it again."""
        parts: list[bytes] = []
        size = 0
        more = True
        while more and size <= self.limit:
            message = await receive()
            if message["type"] != "http.request":
                break
            parts.append(message.get("body", b""))
            size += len(parts[-1])
            more = message.get("more_body", False)
        body = b"".join(parts)
        replayed = False

        async def again() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": more}
            return await receive()

        return body, again

    async def _error(
        self, send: Any, scope: Any, status: int, message: str, extra: list[Any] | None = None
    ) -> None:
        body = self.error_body(scope, status, message)
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
        await send({"type": "http.response.body", "body": body})


def _object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body or b"{}")
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _field(body: bytes, name: str) -> Any:
    return _object(body).get(name)


async def _json(send: Any, status: int, payload: Any) -> None:
    body = msgspec.json.encode(payload)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class _Filtered:
    """A ``send`` that keeps only the items of ``key`` in a JSON answer that ``keep`` accepts."""

    def __init__(self, send: Any, keep: Callable[[Any], bool], key: str) -> None:
        self.send, self.keep, self.key = send, keep, key
        self.start: Any = None
        self.parts: list[bytes] = []

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        if message["type"] != "http.response.body":
            await self.send(message)
            return
        self.parts.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = b"".join(self.parts)
        if self.start["status"] == 200:
            data = json.loads(body)
            if isinstance(data, dict) and isinstance(data.get(self.key), list):
                data[self.key] = [item for item in data[self.key] if self.keep(item)]
                body = msgspec.json.encode(data)
        headers = [(k, v) for k, v in self.start["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.send({**self.start, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})


class _EventFilter:
    """A ``send`` for an event stream that drops the frames of sessions ``mine`` refuses and cuts their
    places out of every cursor (``id:`` line)."""

    def __init__(self, send: Any, mine: Callable[[str], bool]) -> None:
        self.send, self.mine = send, mine

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            frames = []
            for frame in message["body"].split(b"\n\n"):
                kept = self._frame(frame)
                if kept is not None:
                    frames.append(kept)
            body = b"\n\n".join(frames)
            if not body and message.get("more_body", False):
                return
            message = {**message, "body": body}
        await self.send(message)

    def _frame(self, frame: bytes) -> bytes | None:
        lines = frame.split(b"\n")
        out = []
        for line in lines:
            if line.startswith(b"data: "):
                try:
                    sid = json.loads(line[6:]).get("session_id")
                except ValueError:
                    sid = None
                if isinstance(sid, str) and not self.mine(sid):
                    return None
            if line.startswith(b"id: "):
                places = [p for p in line[4:].split(b",") if p and self.mine(p.rpartition(b":")[0].decode())]
                line = b"id: " + b",".join(places)
            out.append(line)
        return b"\n".join(out)


class _Claim:
    """A ``send`` that, once the answer is complete, records the id it finds (by ``pattern``) as the
    tenant's: the response or conversation the request made."""

    def __init__(self, send: Any, gate: TenantGate, who: str, pattern: re.Pattern[bytes]) -> None:
        self.send, self.gate, self.who, self.pattern = send, gate, who, pattern
        self.found: str | None = None
        self.seen = 0
        self.status = 0

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.body":
            body = message.get("body", b"")
            if self.found is None and self.seen < 65536:
                self.seen += len(body)
                match = self.pattern.search(body)
                if match is not None:
                    self.found = match.group(1).decode()
                    self.gate.tenants.own(
                        self.found, self.who
                    )  # at once: the client may ask for it mid-stream
            if not message.get("more_body", False) and self.found is not None:
                self.gate.claim(self.found, self.who)
                self.gate.tenants.audit(self.who, "create", self.found, self.status)
        elif message["type"] == "http.response.start":
            self.status = message["status"]
        await self.send(message)


class _Audit:
    """A ``send`` that writes the audit line of ``action`` on ``item`` once the answer has started."""

    def __init__(self, send: Any, tenants: Tenants, who: str, action: str, item: str) -> None:
        self.send, self.tenants, self.who, self.action, self.item = send, tenants, who, action, item

    async def __call__(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.tenants.audit(self.who, self.action, self.item, message["status"])
            if message["status"] == 200 and self.action == "delete":
                self.tenants.disown(self.item)
        await self.send(message)
