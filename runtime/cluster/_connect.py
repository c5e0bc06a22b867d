"""Reaching a Ray cluster: Ray itself (an optional extra), the address checked before ``ray.init``, and
:func:`connect` (to a cluster, to the one this process is connected to, or to a local one it starts).

``ray.init(address=...)`` waits minutes on an address where nothing listens, or where something that is not
Ray does. :func:`probe` answers in seconds: a Ray head's GCS (and a Ray client server) speaks gRPC, so it
answers HTTP/2's connection preface with a SETTINGS frame.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from typing import Any

from runtime.cluster._errors import ClusterError, ClusterUnavailable

__all__ = ["accepts", "check_address_form", "connect", "import_ray", "probe", "same_address", "split_address"]


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ClusterError(
            "the cluster runtime needs Ray: install agentcell with the ray extra (pip install 'agentcell[ray]')"
        ) from None
    return ray


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"Ray address {address!r}: expected HOST:PORT (the head node's GCS port, 6379 unless "
            "`ray start --head --port` said otherwise), ray://HOST:PORT, or 'auto'"
        )
    return host.strip("[]"), int(port)


def check_address_form(address: str) -> None:
    if address != "auto":
        split_address(address)


def same_address(a: str, b: str) -> bool:
    try:
        (host_a, port_a), (host_b, port_b) = split_address(a), split_address(b)
    except ValueError:
        return False
    if port_a != port_b:
        return False
    try:
        return {i[4][0] for i in socket.getaddrinfo(host_a, port_a)} & {
            i[4][0] for i in socket.getaddrinfo(host_b, port_b)
        } != set()
    except OSError:
        return host_a == host_b


_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # + SETTINGS


def probe(address: str, timeout: float = 3.0) -> None:
    """Raise :class:`ClusterUnavailable` unless something at ``address`` answers as a Ray cluster would.

    ``ray.init`` waits a long time (minutes) on an address where nothing listens or something else does;
    a Ray head's GCS (and a Ray client server) speaks gRPC, so it answers HTTP/2's connection preface with a
    SETTINGS frame. Skipped for ``"auto"`` and with TLS on (``RAY_USE_TLS``).
    """
    if address == "auto":
        return
    host, port = split_address(address)
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            if os.environ.get("RAY_USE_TLS", "0") not in ("0", ""):
                return
            conn.settimeout(timeout)
            conn.sendall(_HTTP2_PREFACE)
            head = b""
            while len(head) < 9:
                chunk = conn.recv(9 - len(head))
                if not chunk:
                    break
                head += chunk
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise ClusterUnavailable(f"no Ray cluster answers at {address}: {reason}") from None
    if len(head) < 9 or head[3] != 0x04:
        raise ClusterUnavailable(
            f"something answers at {address}, but not as a Ray cluster (no gRPC); give the head node's GCS "
            "address (port 6379 unless `ray start --head --port` said otherwise)"
        )


def accepts(address: str, timeout: float = 3.0) -> bool:
    """Whether something at ``HOST:PORT`` accepts a connection (the GCS of a cluster that is still there)."""
    try:
        host, port = split_address(address)
        socket.create_connection((host, port), timeout=timeout).close()
    except (OSError, ValueError):
        return False
    return True


def connect(ray: Any, address: str | None, *, cpus: int, ray_init: Mapping[str, Any]) -> bool:
    """Connect this process to the Ray cluster at ``address`` (checked with :func:`probe` first), or keep the
    connection it has (which must be to that cluster), or start a local cluster with at least ``cpus`` CPUs
    when ``address`` is None and there is none. ``ray_init``: more keyword arguments for ``ray.init``.
    Returns whether this call connected (so that the caller disconnects)."""
    if address is not None:
        probe(address)
    if ray.is_initialized():
        current = ray.get_runtime_context().gcs_address
        if address not in (None, "auto") and not same_address(address, current):
            raise ClusterError(
                f"this process is connected to the Ray cluster at {current} already; a process talks "
                f"to one cluster at a time (ray.shutdown() first to use {address})"
            )
        return False
    if address is not None:
        try:
            ray.init(address=address, **ray_init)
        except Exception as exc:  # ConnectionError, RuntimeError, ...: Ray's own words say why
            raise ClusterUnavailable(f"cannot connect to the Ray cluster at {address}: {exc}") from None
        return True
    options: dict[str, Any] = {
        "num_cpus": max(os.cpu_count() or 1, cpus),
        "include_dashboard": False,
        "_system_config": {"worker_niceness": 0},  # shards do the work: not at Ray's niceness 15
        **ray_init,
    }
    ray.init(**options)
    return True
