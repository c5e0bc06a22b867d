"""MCP tools end to end over stdio (design §3.9): a real MCP server, written with the ``mcp`` SDK's own server
API (tests/tools/mcp_server.py), run by the runtime as a subprocess; the local provider's model calls its
tools as ``t__tool`` and gets their results.

A server takes a second or more to start on a loaded machine (the SDK imports much), so the calm cases
share one session and its server; the hostile ones (crashes, hangs, failed starts) get their own.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Runtime
from runtime.config import Config
from tests.conftest import Recorder
from tests.tools.mcp_support import Model, alive, call, results, stdio

pytest.importorskip("mcp")

_names = iter(range(1_000_000))


@pytest.fixture(scope="module")
def world(provider: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """One runtime, one model, and one session whose server ``t`` the calm tests share."""
    root = tmp_path_factory.mktemp("mcp")
    workspace = root / "ws"
    workspace.mkdir()
    os.environ["AGENTCELL_TEST_GREETING"] = "hello from the environment"
    config = Config().with_overrides(
        {"mcp": {"ping_timeout": 1.0, "restart_backoff": 30.0}, "runtime": {"tool_workers": 24}}
    )
    model = Model()
    name = f"mcp-model-{next(_names)}"
    provider.add_responder(name, model)
    recorder = Recorder()
    with Runtime(config, sessions_dir=root / "sessions") as rt:
        sub = rt.subscribe(callback=recorder)

        def deny_marked(_sid: str, tool_call: Any) -> bool | str:
            return "not this one" if "deny-me" in tool_call.arguments else True

        sid = rt.start_session(
            model=f"openai/{name}",
            api_base=provider.url,
            api_key="sk-local",
            tools="builtin",
            workspace=workspace,
            approval=deny_marked,
            mcp_servers={
                "t": stdio("--bad-schema", timeout=5.0, env={"GREETING": "${AGENTCELL_TEST_GREETING}"})
            },
        )
        yield {"rt": rt, "sid": sid, "model": model, "events": recorder, "workspace": workspace, "name": name}
        sub.close()
    os.environ.pop("AGENTCELL_TEST_GREETING", None)


def test_the_model_sees_the_servers_tools_namespaced_with_their_schemas(world: dict[str, Any]) -> None:
    rt, sid, model = world["rt"], world["sid"], world["model"]
    assert rt.prompt(sid, "hello").result(timeout=90).status == "ok"
    echo = model.tool("t__echo")
    assert echo is not None and echo["description"] == "Echo the text back."
    assert echo["parameters"]["properties"]["text"]["type"] == "string"
    assert echo["parameters"]["required"] == ["text"]
    assert model.tool("read_file") is not None  # the session's own tools stay
    (started,) = world["events"].of("mcp_server_started", sid)
    assert started.server == "t" and started.transport == "stdio" and "t__add" in started.tools
    assert rt.context_stats(sid).tools > 0


def test_a_bad_schema_is_left_out_and_an_odd_name_made_valid(world: dict[str, Any]) -> None:
    rt, sid, model, events = world["rt"], world["sid"], world["model"], world["events"]
    (bad,) = [e for e in events.of("mcp_server_error", sid) if e.kind == "bad_tool"]
    assert bad.tool == "broken_schema" and "not a valid JSON schema" in bad.message
    assert model.tool("t__broken_schema") is None  # never sent: a provider would refuse every request
    (odd,) = results(rt, sid, call("t__dotted_name_with_spaces"))
    assert odd.text == "renamed" and odd.metadata["mcp_tool"] == "dotted.name/with spaces"


def test_calls_return_the_servers_results(world: dict[str, Any]) -> None:
    rt, sid = world["rt"], world["sid"]
    echo, add = results(rt, sid, call(("t__echo", {"text": "hi"}), ("t__add", {"a": 2, "b": 40})))
    assert (echo.text, echo.is_error) == ("echo: hi", False)
    assert (add.text, add.is_error) == ("42", False)
    assert echo.metadata["mcp_server"] == "t" and echo.metadata["mcp_tool"] == "echo"


def test_calls_carry_their_idempotency_key_and_read_only_tools_are_idempotent(world: dict[str, Any]) -> None:
    """Design §3.12: a call's ``_meta`` carries its idempotency key (the call id), and a tool the server
    marks read-only runs again after a crash (idempotent) where one it does not mark is not."""
    rt, sid = world["rt"], world["sid"]
    (key,) = results(rt, sid, call("t__idempotency_key"))
    assert not key.is_error and key.text == key.tool_call_id
    tools = rt._session(sid).spec.tools
    assert tools.get("t__idempotency_key").idempotent
    assert not tools.get("t__echo").idempotent and not tools.get("t__crash").idempotent


def test_an_error_result_stays_an_error_with_its_message(world: dict[str, Any]) -> None:
    (failed,) = results(world["rt"], world["sid"], call(("t__fail", {"message": "the disk is on fire"})))
    assert failed.is_error and "the disk is on fire" in failed.text


def test_bad_arguments_come_back_from_the_server_as_an_error(world: dict[str, Any]) -> None:
    (bad,) = results(world["rt"], world["sid"], call(("t__add", {"a": "many"})))
    assert bad.is_error and "a" in bad.text


def test_images_and_embedded_resources_become_text_and_files(world: dict[str, Any]) -> None:
    picture, document = results(world["rt"], world["sid"], call("t__picture", "t__document"))
    assert not picture.is_error and picture.text.startswith("a tiny picture\n[image (image/png), 68 bytes")
    (saved,) = picture.metadata["mcp_files"]
    data = Path(saved["path"]).read_bytes()
    assert data.startswith(b"\x89PNG") and hashlib.sha256(data).hexdigest() == saved["sha256"]
    assert saved["path"] in picture.text and saved["sha256"] in picture.text
    assert document.text == "[resource file:///notes/readme.txt (text/plain)]\nthe notes"


def test_huge_output_is_clipped_and_spilled(world: dict[str, Any]) -> None:
    (big,) = results(world["rt"], world["sid"], call(("t__big", {"lines": 60_000})))
    assert not big.is_error and big.metadata["truncated"]
    spill = Path(big.metadata["spill_path"])
    full = spill.read_text()
    assert full.count("\n") == 59_999 and full.startswith("line 0000000 of a large output")
    assert big.metadata["spill_sha256"] in big.text and len(big.text) < 60_000


def test_many_parallel_calls_run_at_once_over_one_connection(world: dict[str, Any]) -> None:
    outs = results(world["rt"], world["sid"], call(*[("t__slow", {"seconds": 0.5})] * 16))
    assert len(outs) == 16 and not any(o.is_error for o in outs)
    peaks = [int(o.text.removeprefix("peak=")) for o in outs]
    assert max(peaks) > 1  # the calls overlapped on the server


def test_approval_applies_to_mcp_tools(world: dict[str, Any]) -> None:
    rt, sid, events = world["rt"], world["sid"], world["events"]
    denied, allowed = results(rt, sid, call(("t__echo", {"text": "deny-me"}), ("t__echo", {"text": "fine"})))
    assert denied.is_error and "not this one" in denied.text
    assert allowed.text == "echo: fine"
    asked = [e.name for e in events.of("approval_request", sid)]
    assert asked.count("t__echo") >= 2


def test_the_server_runs_in_the_workspace_with_its_environment(world: dict[str, Any]) -> None:
    cwd, greeting, secret, cpus = results(
        world["rt"],
        world["sid"],
        call("t__cwd", ("t__env", {"name": "GREETING"}), ("t__env", {"name": "OPENAI_API_KEY"}), "t__cpus"),
    )
    # Every CPU of the process, whichever one the runtime keeps its own threads on (runtime.cpu).
    assert json.loads(cpus.text) == sorted(os.sched_getaffinity(0))
    assert Path(cwd.text) == world["workspace"].resolve()
    assert greeting.text == "hello from the environment"
    assert secret.text == "(no output)"  # the runtime's environment is not passed on, only what is named


def test_garbage_from_the_server_is_an_event_and_a_bad_result_an_error(world: dict[str, Any]) -> None:
    rt, sid, events = world["rt"], world["sid"], world["events"]
    garbage, bogus, after = results(rt, sid, call("t__garbage", "t__bogus", ("t__echo", {"text": "still"})))
    assert garbage.text == "answered after garbage"
    assert bogus.is_error and "invalid result" in bogus.text
    assert after.text == "echo: still"
    kinds = [(e.kind, e.tool) for e in events.of("mcp_server_error", sid)]
    assert ("bad_result", None) in kinds and ("bad_result", "bogus") in kinds


def test_a_call_past_its_timeout_is_cut_and_the_server_goes_on(world: dict[str, Any]) -> None:
    rt, sid, events = world["rt"], world["sid"], world["events"]
    (pid,) = results(rt, sid, call("t__pid"))
    slow, quick = results(rt, sid, call(("t__slow", {"seconds": 60}), ("t__add", {"a": 1, "b": 1})))
    assert slow.is_error and slow.metadata["error"] == "timeout" and quick.text == "2"
    (again,) = results(rt, sid, call("t__pid"))
    assert again.text == pid.text  # it answered its ping: not restarted
    assert not [e for e in events.of("mcp_server_error", sid) if e.kind == "unresponsive"]


def test_a_server_can_offer_some_tools_only_and_need_approval(world: dict[str, Any], provider: Any) -> None:
    rt, model = world["rt"], world["model"]
    sid = rt.start_session(
        model=f"openai/{world['name']}",
        api_base=provider.url,
        api_key="sk-local",
        mcp_servers={"f": stdio(tools=["echo", "add"], require_approval=True)},
    )
    (denied,) = results(rt, sid, call(("f__echo", {"text": "x"})))
    offered = sorted(t["function"]["name"] for t in model.offered[-2])  # (the request that made the call)
    assert offered == ["f__add", "f__echo"]
    assert denied.is_error and "requires approval" in denied.text
    rt.stop_session(sid)


def test_hibernation_stops_the_server_and_waking_starts_it_again(world: dict[str, Any]) -> None:
    rt, sid = world["rt"], world["sid"]
    (pid,) = results(rt, sid, call("t__pid"))
    assert rt.hibernate(sid)
    rt._session(sid).spec.mcp.wait_stopped()
    assert not alive(int(pid.text))
    (woken,) = results(rt, sid, call("t__pid"))
    assert not woken.is_error and woken.text != pid.text


def test_the_server_is_stopped_with_its_session(world: dict[str, Any], provider: Any, tmp_path: Path) -> None:
    rt = world["rt"]
    sid = rt.start_session(
        model=f"openai/{world['name']}",
        api_base=provider.url,
        api_key="sk-local",
        mcp_servers=[f"{stdio()['command']} {stdio()['args'][0]}"],
    )
    (pid,) = results(rt, sid, call("mcp_server__pid"))
    assert alive(int(pid.text))
    rt.stop_session(sid)
    assert not alive(int(pid.text))


def test_stopping_the_runtime_leaves_no_server_running(provider: Any, tmp_path: Path) -> None:
    model = Model()
    provider.add_responder("mcp-stop-model", model)
    with Runtime(Config(), sessions_dir=tmp_path) as rt:
        sids = [
            rt.start_session(
                model="openai/mcp-stop-model",
                api_base=provider.url,
                api_key="sk-local",
                mcp_servers={"t": stdio()},
            )
            for _ in range(2)
        ]
        handles = [rt.prompt(sid, call("t__pid")) for sid in sids]
        assert all(h.result(timeout=90).status == "ok" for h in handles)
        pids = [int(m.text) for sid in sids for m in rt.messages(sid) if m.role == "tool"]
        assert len(set(pids)) == 2 and all(alive(p) for p in pids)  # a server of its own per session
    assert not any(alive(p) for p in pids)
    assert json.dumps(pids)
