"""Tenants of ``agentcell serve`` (design §9): who a token is, what each tenant owns, its quotas and usage.

Without ``server.tenants_file`` the server has one token, and its holder sees every session (as before).
With it, the server's own token is the **admin** token (it sees everything) and each tenant of the file has
tokens of its own, stored as SHA-256 hex digests (never the tokens themselves)::

    [tenants.team-a]
    tokens = ["9f86d081884c7d65..."]   # sha256 of each token; two during a rotation
    max_sessions = 100                  # sessions it owns at once
    max_concurrent_turns = 4            # turns of its sessions running at once
    max_tokens_per_day = 2_000_000      # input + output tokens of its turns (UTC day)
    max_spend_per_day = 10.0            # USD, where the model's prices are known
    models = ["openai/gpt-4o-mini"]     # models its sessions may use (absent: any)
    profiles = ["researcher"]           # agent profiles it may name as a Responses model (absent: any)

The file is read again when it changes (at most once a second, on a request), so a token is rotated or
revoked without a restart. A presented token is hashed and compared with every stored digest in constant
time. What a tenant creates (sessions, responses, conversations) is recorded as its own in
``<sessions_dir>/tenants/owners.jsonl``; a sub-agent belongs to its parent's tenant. Who created, resumed,
deleted what goes to ``<sessions_dir>/tenants/audit.jsonl``. Usage per tenant and UTC day is counted from
the event bus (tokens and spend from ``usage_update``: every response a tenant's sessions paid for, their
compactions' included; turns from ``agent_end``) and kept in ``<sessions_dir>/tenants/usage.json``.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import threading
import time
import tomllib
from pathlib import Path
from typing import Any, Final

import msgspec

from runtime import events as ev
from runtime.errors import ConfigError

__all__ = ["ADMIN", "TenantQuota", "Tenants", "token_digest"]

log = logging.getLogger("agentcell.server")

ADMIN: Final = "*admin*"
"""The identity of the admin token (the server's own): it sees and touches everything."""
_RELOAD_EVERY: Final = 1.0
_MAX_PENDING: Final = 10_000


def token_digest(token: str | bytes) -> str:
    """The SHA-256 hex digest a tenants file stores for ``token``."""
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).hexdigest()


class TenantQuota(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One tenant of the tenants file (see the module docstring)."""

    tokens: list[str]
    max_sessions: int | None = None
    max_concurrent_turns: int | None = None
    max_tokens_per_day: int | None = None
    max_spend_per_day: float | None = None
    models: list[str] | None = None
    profiles: list[str] | None = None


class _File(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    tenants: dict[str, TenantQuota] = msgspec.field(default_factory=dict)


def load_tenants(path: Path) -> dict[str, TenantQuota]:
    """The tenants of the file at ``path``; :class:`ConfigError` naming what is wrong."""
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
        tenants = msgspec.convert(raw, _File).tenants
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        raise ConfigError(f"invalid tenants file {path}: {exc}") from None
    for name, quota in tenants.items():
        bad = [t for t in quota.tokens if len(t) != 64 or any(c not in "0123456789abcdef" for c in t)]
        if bad or not quota.tokens:
            raise ConfigError(
                f"invalid tenants file {path}: tenants.{name}.tokens: SHA-256 hex digests needed"
            )
    return tenants


class Tenants:
    """The tenants of a server over ``runtime`` (a local ``Runtime``): identities, ownership, usage, audit."""

    def __init__(self, path: str | os.PathLike[str], admin_token: str, runtime: Any) -> None:
        self.path = Path(path).expanduser()
        self._admin = token_digest(admin_token)
        self._lock = threading.Lock()
        self._stamp: tuple[float, int] = (-1.0, -1)
        self._checked = 0.0
        self.quotas: dict[str, TenantQuota] = {}
        self._reload(force=True)
        self._runtime = runtime
        home = Path(runtime.sessions_path) / "tenants"
        home.mkdir(parents=True, exist_ok=True)
        self._owners_path = home / "owners.jsonl"
        self._audit_path = home / "audit.jsonl"
        self._usage_path = home / "usage.json"
        self._owners: dict[str, str] = {}  # session / response / conversation id -> tenant
        self._read_owners()
        self._running: dict[str, set[str]] = {}  # tenant -> its sessions with a turn running
        # usage of sessions nobody owns yet (one a Responses request started is owned once it answered)
        self._pending: dict[str, tuple[int, float, int]] = {}  # session -> tokens, spend, turns
        self._usage: dict[str, dict[str, float]] = self._read_usage()  # "tenant day" -> tokens, spend
        self._subscription = runtime.subscribe(
            "*", ("agent_start", "agent_end", "usage_update"), callback=self._on_event
        )

    def close(self) -> None:
        self._subscription.close()

    # -- who a token is ---------------------------------------------------------------------------------
    def identify(self, token: bytes) -> str | None:
        """:data:`ADMIN`, a tenant's name, or None for a token nobody has (compared in constant time)."""
        self._reload()
        digest = token_digest(token)
        found: str | None = None
        if hmac.compare_digest(digest, self._admin):
            found = ADMIN
        for name, quota in self.quotas.items():  # every digest compared, whatever matched before
            for stored in quota.tokens:
                if hmac.compare_digest(digest, stored) and found is None:
                    found = name
        return found

    def _reload(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._checked < _RELOAD_EVERY:
            return
        self._checked = now
        try:
            st = self.path.stat()
        except OSError as exc:
            if force:
                raise ConfigError(f"cannot read the tenants file {self.path}: {exc}") from None
            return
        stamp = (st.st_mtime, st.st_size)
        if stamp == self._stamp:
            return
        try:
            quotas = load_tenants(self.path)
        except ConfigError as exc:
            if force:
                raise
            log.error("%s; the tenants of before stay in force", exc)
            return
        with self._lock:
            self.quotas, self._stamp = quotas, stamp

    # -- what each owns -------------------------------------------------------------------------------
    def _read_owners(self) -> None:
        try:
            lines = self._owners_path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return
        for line in lines:
            try:
                entry = json.loads(line)
                if entry.get("tenant"):
                    self._owners[entry["id"]] = entry["tenant"]
                else:
                    self._owners.pop(entry["id"], None)
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line

    def own(self, item: str, tenant: str) -> None:
        """Record ``item`` (a session, response or conversation id) as ``tenant``'s; what a session used
        before it was owned is counted as ``tenant``'s."""
        with self._lock:
            if self._owners.get(item) == tenant:
                return
            self._owners[item] = tenant
            with self._owners_path.open("a", encoding="utf-8") as fh:
                fh.write(json.dumps({"id": item, "tenant": tenant}) + "\n")
            used = self._pending.pop(item, None)
            if used is not None:
                self._count(tenant, used[0], used[1], used[2])

    def disown(self, item: str) -> None:
        with self._lock:
            if self._owners.pop(item, None) is not None:
                with self._owners_path.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps({"id": item, "tenant": None}) + "\n")

    def owner(self, item: str) -> str | None:
        """The tenant of ``item``; a sub-agent session's is its parent's."""
        seen = 0
        while seen < 16:
            tenant = self._owners.get(item)
            if tenant is not None:
                return tenant
            parent = self._parent(item)
            if parent is None:
                return None
            item, seen = parent, seen + 1
        return None

    def _parent(self, session_id: str) -> str | None:
        linked = self._parent_linked(session_id)
        if linked is not None:
            return linked
        try:
            from runtime.served import served

            header = served(self._runtime).stored_header(session_id)
        except Exception:
            return None
        return header.parent_session_id if header is not None else None

    def owned_sessions(self, tenant: str) -> int:
        with self._lock:
            return sum(
                1
                for item, t in self._owners.items()
                if t == tenant and not item.startswith(("resp_", "conv_"))
            )

    # -- usage --------------------------------------------------------------------------------------------
    def _on_event(self, event: ev.Event) -> None:
        """Tokens and spend from each response the session paid for (``usage_update``: its turns' and its
        compactions' summarizer calls, design §4.1), turns from ``agent_end``."""
        tenant = self.owner(event.session_id)
        tokens, cost, turns = 0, 0.0, 0
        if isinstance(event, ev.UsageUpdate):
            tokens, cost = event.usage.input_tokens + event.usage.output_tokens, event.usage.cost or 0.0
            if not tokens and not cost:  # (a compaction's reset or a model switch: nothing paid)
                return
        elif isinstance(event, ev.AgentEnd):
            turns = 1
        with self._lock:
            if tenant is None:
                if not isinstance(event, ev.AgentStart):
                    before = self._pending.pop(event.session_id, (0, 0.0, 0))
                    self._pending[event.session_id] = (
                        before[0] + tokens,
                        before[1] + cost,
                        before[2] + turns,
                    )
                    while len(self._pending) > _MAX_PENDING:
                        del self._pending[next(iter(self._pending))]
                return
            running = self._running.setdefault(tenant, set())
            if isinstance(event, ev.AgentStart):
                if self._parent_linked(event.session_id) is None:
                    running.add(event.session_id)
                return
            if isinstance(event, ev.AgentEnd):
                running.discard(event.session_id)
            self._count(tenant, tokens, cost, turns)

    def _count(self, tenant: str, tokens: int, cost: float, turns: int) -> None:
        day = self._usage.setdefault(f"{tenant} {_today()}", {"tokens": 0.0, "spend": 0.0, "turns": 0.0})
        day["tokens"] += tokens
        day["spend"] += cost
        day["turns"] += turns
        self._write_usage()

    def _parent_linked(self, session_id: str) -> str | None:
        bus = getattr(self._runtime, "bus", None)
        linked = bus.parent_of(session_id) if bus is not None else None
        return str(linked[0]) if linked is not None else None

    def usage(self, tenant: str) -> dict[str, Any]:
        """What ``tenant`` used today (UTC), what runs now, and its quotas."""
        quota = self.quotas.get(tenant)
        with self._lock:
            day = dict(self._usage.get(f"{tenant} {_today()}", {"tokens": 0.0, "spend": 0.0, "turns": 0.0}))
            running = len(self._running.get(tenant, ()))
        return {
            "tenant": tenant,
            "day": _today(),
            "tokens": int(day["tokens"]),
            "spend_usd": round(day["spend"], 6),
            "turns": int(day["turns"]),
            "sessions": self.owned_sessions(tenant),
            "running_turns": running,
            "quotas": {k: v for k, v in msgspec.to_builtins(quota).items() if k != "tokens"} if quota else {},
        }

    def _read_usage(self) -> dict[str, dict[str, float]]:
        try:
            data = json.loads(self._usage_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        today = _today()
        return {k: v for k, v in data.items() if isinstance(v, dict) and k.endswith(today)}

    def _write_usage(self) -> None:
        today = _today()
        current = {k: v for k, v in self._usage.items() if k.endswith(today)}
        self._usage = current
        temporary = self._usage_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(current), encoding="utf-8")
        os.replace(temporary, self._usage_path)

    def refusal(self, tenant: str, *, turn: bool = False, session: bool = False) -> str | None:
        """Why ``tenant`` may not start a turn (``turn``) or a session (``session``) now: the quota reached."""
        quota = self.quotas.get(tenant)
        if quota is None:
            return None
        use = self.usage(tenant)
        if session and quota.max_sessions is not None and use["sessions"] >= quota.max_sessions:
            return f"quota reached: max_sessions ({use['sessions']} of {quota.max_sessions} sessions)"
        if turn:
            if quota.max_concurrent_turns is not None and use["running_turns"] >= quota.max_concurrent_turns:
                return (
                    f"quota reached: max_concurrent_turns ({use['running_turns']} of "
                    f"{quota.max_concurrent_turns} turns running)"
                )
            if quota.max_tokens_per_day is not None and use["tokens"] >= quota.max_tokens_per_day:
                return (
                    f"quota reached: max_tokens_per_day ({use['tokens']} of {quota.max_tokens_per_day} tokens "
                    f"today, {use['day']} UTC)"
                )
            if quota.max_spend_per_day is not None and use["spend_usd"] >= quota.max_spend_per_day:
                return (
                    f"quota reached: max_spend_per_day (${use['spend_usd']:.4f} of ${quota.max_spend_per_day} "
                    f"today, {use['day']} UTC)"
                )
        return None

    def model_refusal(self, tenant: str, model: str | None, *, profile: bool = False) -> str | None:
        """Why ``tenant`` may not use ``model`` (or the agent profile of that name), or None."""
        quota = self.quotas.get(tenant)
        if quota is None or model is None:
            return None
        allowed, kind = (quota.profiles, "profiles") if profile else (quota.models, "models")
        if allowed is not None and model not in allowed:
            return (
                f"quota: {kind}: {model!r} is not among the {kind} this tenant may use ({', '.join(allowed)})"
            )
        return None

    # -- audit ------------------------------------------------------------------------------------------
    def audit(self, who: str, action: str, target: str, status: int) -> None:
        """One line of the audit log: who did what to which id, and how it was answered."""
        entry = {"ts": time.time(), "tenant": who, "action": action, "id": target, "status": status}
        with self._lock, self._audit_path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(entry) + "\n")

    def audit_tail(self, limit: int = 1000) -> list[dict[str, Any]]:
        try:
            lines = self._audit_path.read_text(encoding="utf-8").splitlines()[-limit:]
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line.strip()]


def _today() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime())
