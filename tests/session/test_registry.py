"""runtime.registry: session id → refs, safe from many threads, at 100,000 sessions."""

from __future__ import annotations

import threading

import pytest

from runtime.registry import AlreadyRegistered, SessionRegistry


def test_register_lookup_and_unregister() -> None:
    registry: SessionRegistry[dict[str, str]] = SessionRegistry()
    refs = {"store": "store-ref", "agent": "agent-ref"}
    registry.register("s1", refs)
    assert registry.lookup("s1") is refs and registry.get("s1") is refs and registry["s1"] is refs
    assert "s1" in registry and len(registry) == 1
    assert registry.lookup("nope") is None and registry.get("nope", refs) is refs
    with pytest.raises(KeyError):
        registry["nope"]
    assert registry.unregister("s1") is refs
    assert "s1" not in registry and len(registry) == 0
    assert registry.unregister("s1") is None


def test_a_taken_id_is_refused_unless_replacing() -> None:
    registry: SessionRegistry[str] = SessionRegistry()
    registry.register("s1", "first")
    with pytest.raises(AlreadyRegistered, match="'s1' is already registered"):
        registry.register("s1", "second")
    assert registry["s1"] == "first"
    registry.register("s1", "second", replace=True)
    assert registry["s1"] == "second"


def test_unregister_with_an_entry_only_removes_that_entry() -> None:
    registry: SessionRegistry[object] = SessionRegistry()
    old, new = object(), object()
    registry.register("s1", old)
    registry.register("s1", new, replace=True)
    assert registry.unregister("s1", old) is None  # a stale owner cannot remove the new entry
    assert registry.unregister("s1", new) is new


def test_listings_are_snapshots_in_registration_order() -> None:
    registry: SessionRegistry[int] = SessionRegistry()
    for i in range(5):
        registry.register(f"s{i}", i)
    for sid in registry:  # mutating while iterating is safe
        registry.unregister(sid)
        registry.register(sid + "-again", 0)
    assert registry.keys() == [f"s{i}-again" for i in range(5)]
    assert registry.values() == [0] * 5
    assert registry.items()[0] == ("s0-again", 0)
    registry.clear()
    assert len(registry) == 0


def test_100k_sessions() -> None:
    registry: SessionRegistry[tuple[int, int]] = SessionRegistry()
    for i in range(100_000):
        registry.register(f"session-{i}", (i, i))
    assert len(registry) == 100_000
    assert all(registry.lookup(f"session-{i}") == (i, i) for i in range(0, 100_000, 7))
    for i in range(0, 100_000, 2):
        registry.unregister(f"session-{i}")
    assert len(registry) == 50_000 and registry.lookup("session-1") == (1, 1)


def test_concurrent_registration_and_lookup() -> None:
    registry: SessionRegistry[int] = SessionRegistry()
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def writer(base: int) -> None:
        barrier.wait()
        for i in range(base, base + 5_000):
            registry.register(f"s{i}", i)

    def reader() -> None:
        barrier.wait()
        try:
            for _ in range(20):
                for sid, value in registry.items():
                    assert registry.lookup(sid) in (value, None)
        except BaseException as exc:
            errors.append(exc)

    def racer() -> None:  # everyone tries to take the same ids: exactly one wins each
        barrier.wait()
        for i in range(1_000):
            try:
                registry.register(f"contended-{i}", -1)
            except AlreadyRegistered:
                pass

    threads = [threading.Thread(target=writer, args=(n * 5_000,)) for n in range(3)]
    threads += [
        threading.Thread(target=reader),
        threading.Thread(target=racer),
        threading.Thread(target=racer),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert len(registry) == 15_000 + 1_000
    assert all(registry[f"s{i}"] == i for i in range(15_000))
