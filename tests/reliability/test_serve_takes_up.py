"""A restarted ``agentcell serve`` takes up, as it starts, the turns it was killed in (design §3.12): found from
the journal of open turns (``<sessions>/turns/``), not by opening every log, and without waiting for a
request that touches the session."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from runtime import Runtime
from runtime.apps.server import ApiServer
from runtime.config import Config
from runtime.provider import Turn
from runtime.store.turns import TURNS_DIR
from tests.conftest import wait_until
from tests.serve import serve_process

TOKEN = "take-up-token"
ANSWER = "answered by the server that came back"


def _start_a_turn(url: str, model: str) -> tuple[str, str]:
    """Over the server at ``url``: a new session of ``model``, sent a prompt without waiting for its turn.
    Returns the session's id and the prompt's."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60) as http:
        created = http.post("/sessions", json={"model": model})
        assert created.status_code == 201, created.text
        sid = created.json()["id"]
        sent = http.post(f"/sessions/{sid}/prompt", json={"text": "finish this", "wait": False})
        assert sent.status_code == 202, sent.text
        return sid, sent.json()["prompt_id"]


def _log_of(sessions: Path, session_id: str) -> Path:
    (log,) = sessions.rglob(f"{session_id}.jsonl")
    return log


def test_the_server_takes_up_the_turns_a_dead_runtime_left_open_and_keeps_their_results(
    sessions_dir: Path, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: the log and the journal of open turns as a runtime left them when it died mid-turn
    (copied while the turn ran); a server over a new runtime takes the turn up when asked
    (``take_up_interrupted``, what ``agentcell serve`` does as it starts), under its policy, and answers
    the turn's result under the prompt id the client had."""
    provider.add_script("cut-in-process", [Turn(text="never delivered", latency=30), Turn(text=ANSWER)])
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    with Runtime(sessions_dir=sessions_dir) as rt:
        sid = rt.start_session(model="openai/cut-in-process")
        prompt_id = rt.prompt(sid, "finish this").id
        wait_until(
            lambda: provider.remaining_turns("cut-in-process") == 1, "the turn never reached the model"
        )
        rt.flush()
        log_then = _log_of(sessions_dir, sid).read_bytes()
        (journal,) = (sessions_dir / TURNS_DIR).iterdir()
        journal_then = journal.read_bytes()
    assert f"+{sid}".encode() in journal_then
    _log_of(sessions_dir, sid).write_bytes(log_then)  # as the process that died left them
    (sessions_dir / TURNS_DIR / "1-dead.jsonl").write_bytes(journal_then)

    with Runtime(sessions_dir=sessions_dir) as rt, ApiServer(rt, TOKEN) as server:
        assert server.take_up_interrupted(timeout=60) == [sid]
        assert server.take_up_interrupted(timeout=60) == []  # hosted here now
        with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            result = http.get(f"/sessions/{sid}/turns/{prompt_id}", params={"wait": "true"}, timeout=60)
        assert result.status_code == 200, result.text
        assert result.json()["status"] == "ok" and result.json()["message"]["parts"][0]["text"] == ANSWER


def test_a_server_whose_config_says_not_to_resume_turns_leaves_them_as_they_are(
    sessions_dir: Path, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``agent.resume_turns = false`` (design §3.12): a cut-off turn is not taken up. A server so configured
    does not resume, as it starts, the sessions a dead runtime left mid-turn (before, it resumed them and
    their agents wrote the turns off as interrupted at once); a session whose own config says to resume
    turns is taken up all the same. The one left is still listed, and a request that resumes it later finds
    its turn ended as interrupted, as any resume under that config does."""
    for name in ("keeps-off", "keeps-on"):
        provider.add_script(name, [Turn(text="never delivered", latency=30), Turn(text=ANSWER)])
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    with Runtime(sessions_dir=sessions_dir) as rt:
        # (a key each: a pool with nothing learned yet sends one call at a time, §3.11)
        off = rt.start_session(model="openai/keeps-off", api_key="sk-off")
        on = rt.start_session(model="openai/keeps-on", api_key="sk-on", config={"agent.resume_turns": True})
        for sid in (off, on):
            rt.prompt(sid, "finish this")
        wait_until(
            lambda: provider.remaining_turns("keeps-off") == provider.remaining_turns("keeps-on") == 1,
            "the turns never reached the model",
        )
        rt.flush()
        logs = {sid: _log_of(sessions_dir, sid).read_bytes() for sid in (off, on)}
        (journal,) = (sessions_dir / TURNS_DIR).iterdir()
        journal_then = journal.read_bytes()
    for sid, data in logs.items():  # as the process that died left them
        _log_of(sessions_dir, sid).write_bytes(data)
    (sessions_dir / TURNS_DIR / "1-dead.jsonl").write_bytes(journal_then)

    config = Config().with_overrides({"agent.resume_turns": False})
    with Runtime(config, sessions_dir=sessions_dir) as rt, ApiServer(rt, TOKEN) as server:
        assert server.take_up_interrupted(timeout=60) == [on]
        assert off not in rt.hosted_sessions()
        assert _log_of(sessions_dir, off).read_bytes() == logs[off]  # not even opened
        assert rt.interrupted_sessions() == [off]
        rt.resume_session(off)
        assert rt.resumed_turn(off) is None  # ended as interrupted, as the config says
        assert rt.interrupted_sessions() == []
        assert rt.resumed_turn(on) is not None


@pytest.mark.slow  # two `agentcell serve` processes, the first killed with SIGKILL mid-turn
def test_a_server_killed_mid_turn_finishes_the_turn_when_it_starts_again_without_a_request(
    tmp_path: Path, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    provider.add_script("cut-off", [Turn(text="never delivered", latency=60), Turn(text=ANSWER)])
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    sessions = tmp_path / "sessions"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with serve_process(sessions, "--token", TOKEN, check_exit=False) as served:
        sid, prompt_id = _start_a_turn(served.url, "openai/cut-off")
        deadline = time.monotonic() + 30
        while provider.remaining_turns("cut-off") == 2:  # the model is asked: the turn is under way
            assert time.monotonic() < deadline, "the turn never reached the model"
            time.sleep(0.02)
        served.process.send_signal(signal.SIGKILL)
        served.process.wait(timeout=30)
    assert ANSWER not in _log_of(sessions, sid).read_text()

    with serve_process(sessions, "--token", TOKEN) as served:
        deadline = time.monotonic() + 60
        while ANSWER not in _log_of(sessions, sid).read_text():  # no request to the server meanwhile
            assert time.monotonic() < deadline, "the restarted server did not take the turn up by itself"
            time.sleep(0.05)
        with httpx.Client(base_url=served.url, headers=auth, timeout=60) as http:
            result = http.get(f"/sessions/{sid}/turns/{prompt_id}", params={"wait": "true"})
            assert result.status_code == 200, result.text
            body = result.json()
            assert body["status"] == "ok" and body["prompt_id"] == prompt_id
            assert body["message"]["parts"][0]["text"] == ANSWER
    assert not list((sessions / "turns").iterdir())  # stopped with no turn open: no journal left


@pytest.mark.slow  # two `agentcell serve --shards 2` processes (a local Ray cluster each), the first SIGKILLed
def test_a_sharded_server_killed_mid_turn_finishes_the_turn_when_it_starts_again(
    tmp_path: Path, provider: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, with the sessions on two Ray shards (design §10.4): the server and its shards die with a
    SIGKILL of the server mid-turn; a server started again on the same sessions takes the turn up on one of
    its shards by itself, and answers ``GET .../turns/{prompt_id}`` with its result."""
    provider.add_script("cut-sharded", [Turn(text="never delivered", latency=120), Turn(text=ANSWER)])
    monkeypatch.setenv("OPENAI_BASE_URL", provider.url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-local")
    sessions = tmp_path / "sessions"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    args = ("--token", TOKEN, "--shards", "2")
    with serve_process(sessions, *args, start_timeout=120, check_exit=False) as served:
        sid, prompt_id = _start_a_turn(served.url, "openai/cut-sharded")
        wait_until(
            lambda: provider.remaining_turns("cut-sharded") == 1, "the turn never reached the model", 60
        )
        served.process.send_signal(signal.SIGKILL)
        served.process.wait(timeout=30)
    assert ANSWER not in _log_of(sessions, sid).read_text()

    with serve_process(sessions, *args, start_timeout=120) as served:
        wait_until(
            lambda: ANSWER in _log_of(sessions, sid).read_text(),
            "the restarted server did not take the turn up by itself",
            120,
        )
        with httpx.Client(base_url=served.url, headers=auth, timeout=60) as http:
            result = http.get(f"/sessions/{sid}/turns/{prompt_id}", params={"wait": "true"})
            assert result.status_code == 200, result.text
            body = result.json()
            assert body["status"] == "ok" and body["prompt_id"] == prompt_id
            assert body["message"]["parts"][0]["text"] == ANSWER
