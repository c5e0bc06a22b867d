"""A session's MCP servers over its life (design §3.9): started with its first turn, stopped when it
hibernates and started again when it wakes, kept in its log (a credential withheld) and brought back
when it is resumed by another runtime, which adds its own ``[mcp.servers]``; the runtime's servers go to
every session; a sub-agent uses its parent's. No server process outlives any of it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from runtime.provider.script import ToolCallSpec, Turn
from tests.conftest import Recorder
from tests.tools.mcp_support import Model, alive, call, results, stdio

pytest.importorskip("mcp")

TOKEN = "sk-live-7c1d2e3f4a5b6c7d8e9f"


@pytest.mark.slow  # six server starts: 20-40 s on a loaded machine (each part also has a faster test)
def test_servers_follow_the_session_through_hibernation_resume_and_a_sub_agent(
    provider: Any, tmp_path: Path
) -> None:
    provider.add_responder("mcp-life-model", Model())
    sessions = tmp_path / "sessions"
    events = Recorder()
    with Runtime(Config(), sessions_dir=sessions) as rt:
        rt.subscribe(callback=events)
        sid = rt.start_session(
            "life",
            model="openai/mcp-life-model",
            api_base=provider.url,
            api_key="sk-local",
            mcp_servers={"t": stdio(env={"API_TOKEN": TOKEN, "MODE": "calm"})},
        )
        assert not events.of("mcp_server_started")  # nothing runs before the first turn needs it
        pid, mode = results(rt, sid, call("t__pid", ("t__env", {"name": "MODE"})))
        assert mode.text == "calm" and alive(int(pid.text))

        assert rt.hibernate(sid)  # its actors park, and its server stops ...
        rt._session(sid).spec.mcp.wait_stopped()
        assert not alive(int(pid.text))
        (woken,) = results(rt, sid, call("t__pid"))  # ... and starts again when it wakes
        assert woken.text != pid.text and alive(int(woken.text))
    assert not alive(int(woken.text))

    # Another runtime, with a server of its own for every session, resumes it.
    config = Config().with_overrides({"mcp": {"servers": {"c": stdio()}}})
    with Runtime(config, sessions_dir=sessions) as rt:
        rt.subscribe(callback=events)
        rt.resume_session("life", api_key="sk-local")
        (token,) = results(rt, "life", call(("c__env", {"name": "MODE"})))
        # Its own server t came back from the log without its credential: it says so and does not start.
        failed = [e for e in events.of("mcp_server_error", "life") if e.server == "t"]
        assert failed and "API_TOKEN" in failed[-1].message and "secret" in failed[-1].message
        assert token.text == "(no output)"  # c runs (with the runtime's environment left out)
        rt.stop_session("life")

        # Given again, it comes back; a sub-agent delegated to uses the parent's servers.
        rt.resume_session("life", api_key="sk-local", mcp_servers={"t": stdio(env={"API_TOKEN": TOKEN})})
        (secret,) = results(rt, "life", call(("t__env", {"name": "API_TOKEN", "digest": True})))
        assert secret.text == hashlib.sha256(TOKEN.encode()).hexdigest()

        provider.add_script(
            "mcp-life-child",
            [
                Turn(tool_calls=(ToolCallSpec(name="t__add", arguments=json.dumps({"a": 20, "b": 22})),)),
                Turn(text="42"),
            ],
        )
        parent = rt.start_session(
            model="openai/mcp-life-model",
            api_base=provider.url,
            api_key="sk-local",
            mcp_servers={"t": stdio()},
            agents={"helper": {"description": "adds", "model": "openai/mcp-life-child", "tools": "inherit"}},
        )
        (answer,) = results(rt, parent, call(("t__pid", {})))
        (delegated,) = results(rt, parent, call(("agent", {"profile": "helper", "task": "add 20 and 22"})))
        assert delegated.text == "42" and not delegated.is_error
        started = [e for e in events.of("mcp_server_started") if e.session_id not in ("life", parent)]
        assert not started  # the sub-agent ran no server of its own
        pids = [int(answer.text)]
    assert not any(alive(p) for p in pids)

    # The credential was never written: not in the log, the transcript, or anything beside them.
    written = [p for p in sessions.rglob("*") if p.is_file()]
    assert written and not [p for p in written if TOKEN.encode() in p.read_bytes()]
