"""Session ids are validated and can never name a path (design §2.4)."""

from __future__ import annotations

import pytest

from runtime.ids import InvalidSessionId, validate_session_id


@pytest.mark.parametrize("good", ["a", "session-1", "2026.11.22_run", "A" * 128, "x.y-z_0"])
def test_good_ids_pass(good: str) -> None:
    assert validate_session_id(good) == good


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("", "empty"),
        ("../etc/passwd", "separator"),
        ("..", "'..'"),
        ("a..b", "'..'"),
        ("/abs", "separator"),
        ("a\\b", "separator"),
        ("a\x00b", "may only use"),
        (".hidden", "must start"),
        ("-rf", "must start"),
        ("a b", "may only use"),
        ("nl\n", "may only use"),
        ("é", "may only use"),
        ("A" * 129, "limit is 128"),
    ],
)
def test_hostile_ids_are_refused_with_a_reason(bad: str, why: str) -> None:
    with pytest.raises(InvalidSessionId, match=why):
        validate_session_id(bad)


def test_non_string_is_refused() -> None:
    with pytest.raises(InvalidSessionId, match="must be a string"):
        validate_session_id(42)
