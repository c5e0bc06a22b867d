"""The pure parts of MCP support (design §3.9): tool names and schemas as the model gets them, results as
text, server definitions from command lines, and what of them a session log may keep (design §9)."""

from __future__ import annotations

import base64
import hashlib
from types import SimpleNamespace as NS
from typing import Any

import pytest

from runtime.config import Config, ConfigError, McpServerConfig
from runtime.tools.mcp.convert import check_schema, clip_description, convert_result, tool_names
from runtime.tools.mcp.servers import (
    WITHHELD,
    expand,
    looks_secret,
    parse_command_line,
    parse_servers,
    restored,
    scrub,
    secret_values,
    stored,
    withheld,
)


def test_tool_names_are_namespaced_and_made_valid() -> None:
    names = tool_names("fs", ["read", "dotted.name/with spaces", "x" * 80, "read"])
    assert list(names.values())[:2] == ["read", "dotted.name/with spaces"]
    assert "fs__read" in names and "fs__dotted_name_with_spaces" in names
    long = next(k for k, v in names.items() if v == "x" * 80)
    assert len(long) == 64 and long.startswith("fs__xxx")
    assert tool_names("s", ["a.b", "a_b"]) == {
        "s__a_b": "a.b",
        f"s__a_b_{hashlib.sha1(b'a_b').hexdigest()[:8]}": "a_b",
    }
    assert tool_names("s", [""]) == {}


@pytest.mark.parametrize(
    ("schema", "why"),
    [
        ("not a dict", "not a JSON object"),
        ({"type": "string"}, "not an object of arguments"),
        ({"type": "object", "properties": []}, "'properties' is not an object"),
        ({"type": "object", "properties": {"x": {"type": 12}}}, "not a valid JSON schema"),
        (
            {"type": "object", "properties": {f"p{i}": {"description": "x" * 100} for i in range(800)}},
            "too large",
        ),
    ],
)
def test_a_schema_a_provider_would_refuse_is_not_sent(schema: Any, why: str) -> None:
    reason = check_schema(schema)
    assert isinstance(reason, str) and why in reason


def test_a_good_schema_is_completed_not_changed() -> None:
    assert check_schema({}) == {"type": "object", "properties": {}}
    schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
    assert check_schema(schema) == schema


def test_descriptions_are_clipped_and_made_encodable() -> None:
    assert clip_description("a" * 50, 20).endswith("… [description cut]")
    assert clip_description("bad \ud800 char", 100) == "bad ? char"


def _saver(saved: list[bytes]) -> Any:
    def save(data: bytes, kind: str, mime: str) -> tuple[str, str]:
        saved.append(data)
        return f"/spill/{kind}.bin", hashlib.sha256(data).hexdigest()

    return save


def test_results_become_text_and_files() -> None:
    saved: list[bytes] = []
    png = b"\x89PNG fake"
    result = NS(
        content=[
            NS(type="text", text="caption"),
            NS(type="image", mime_type="image/png", data=base64.b64encode(png).decode()),
            NS(type="audio", mime_type="audio/wav", data="%%% not base64"),
            NS(type="resource", resource=NS(uri="file:///a.txt", mime_type="text/plain", text="body")),
            NS(
                type="resource",
                resource=NS(
                    uri="file:///b.bin",
                    mime_type=None,
                    blob=base64.b64encode(b"\x00\x01").decode(),
                    text=None,
                ),
            ),
            NS(
                type="resource_link",
                name="doc",
                uri="https://x/doc",
                mime_type="text/html",
                description="the doc",
            ),
            NS(type="hologram"),
        ],
        structured_content={"ignored": True},
        is_error=False,
    )
    out = convert_result(result, _saver(saved))
    lines = out.text.split("\n")
    assert lines[0] == "caption"
    assert lines[1].startswith("[image (image/png), 9 bytes, saved to /spill/image.bin (sha256 ")
    assert "not valid base64" in lines[2]
    assert lines[3:5] == ["[resource file:///a.txt (text/plain)]", "body"]
    assert lines[5].startswith("[resource file:///b.bin] [resource (application/octet-stream), 2 bytes")
    assert lines[6] == "[resource link: doc https://x/doc (text/html)] the doc"
    assert "unknown type 'hologram'" in lines[7]
    assert saved == [png, b"\x00\x01"] and [f["kind"] for f in out.files] == ["image", "resource"]
    assert not out.is_error


def test_structured_content_alone_and_errors() -> None:
    out = convert_result(NS(content=[], structured_content={"n": 1}, is_error=True), _saver([]))
    assert (out.text, out.is_error) == ('{"n": 1}', True)
    assert convert_result(NS(content=None), _saver([])).text == ""


def test_command_lines_and_urls_become_named_servers() -> None:
    name, server = parse_command_line("fs=npx -y @modelcontextprotocol/server-filesystem '/my dir'")
    assert name == "fs" and server.command == "npx" and server.args[-1] == "/my dir"
    assert parse_command_line("python3 -m tools.server --x")[0] == "tools"
    assert parse_command_line("python srv/weather.py")[0] == "weather"
    assert parse_command_line("uvx mcp-server-git")[0] == "mcp-server-git"
    name, server = parse_command_line("https://example.com:8443/mcp")
    assert (name, server.url, server.transport) == ("example_com", "https://example.com:8443/mcp", "http")
    servers = parse_servers(["python a.py", "python b/a.py", "gh=https://x/mcp"])
    assert list(servers) == ["a", "a-2", "gh"]
    with pytest.raises(ConfigError, match="two MCP servers are named"):
        parse_servers(["x=cmd", "x=cmd2"])
    with pytest.raises(ConfigError, match="invalid MCP server name"):
        parse_servers({"no__double": {"command": "x"}})
    with pytest.raises(ConfigError, match="either a command"):
        parse_servers({"both": {"command": "x", "url": "http://y"}})
    with pytest.raises(ConfigError, match="http"):
        parse_servers({"ftp": {"url": "ftp://y"}})


def test_config_file_servers_are_checked() -> None:
    cfg = Config().with_overrides(
        {"mcp": {"servers": {"git": {"command": "uvx", "args": ["mcp-server-git"]}}}}
    )
    assert cfg.mcp.servers["git"].args == ["mcp-server-git"]
    with pytest.raises(ConfigError, match="MCP server name"):
        Config().with_overrides({"mcp": {"servers": {"bad name": {"command": "x"}}}})


@pytest.mark.parametrize(
    ("name", "value", "secret"),
    [
        ("GITHUB_TOKEN", "abc", True),
        ("Authorization", "x", True),
        ("X-Api-Key", "k", True),
        ("PGPASSWORD", "hunter2", False),  # (a name the patterns do not know, a value too short to tell)
        ("MODE", "fast", False),
        ("ANY", "Bearer abc.def", True),
        ("ANY", "sk-proj-abc", True),
        ("ANY", "AbCdEfGh12345678ZyXwVu99", True),
        ("HOME", "/home/someone/with/a/long/path", False),
        ("GITHUB_TOKEN", "${GITHUB_TOKEN}", False),  # a reference, not a value
    ],
)
def test_what_looks_like_a_secret(name: str, value: str, secret: bool) -> None:
    assert looks_secret(name, value) is secret


def test_a_session_log_keeps_servers_without_their_secrets() -> None:
    server = McpServerConfig(
        command="srv",
        args=["--token", "abc123", "--api-key=sk-1", "--port", "80", "ghp_xyz"],
        env={"GITHUB_TOKEN": "t0", "MODE": "x", "REF": "${HOME}"},
        url=None,
    )
    http = McpServerConfig(
        url="https://user:pw@h/mcp?api_key=k1&x=1", headers={"Authorization": "Bearer zz", "X-Trace": "on"}
    )
    kept = stored({"s": server, "h": http})
    assert kept["s"]["args"] == ["--token", WITHHELD, f"--api-key={WITHHELD}", "--port", "80", WITHHELD]
    assert kept["s"]["env"] == {"GITHUB_TOKEN": WITHHELD, "MODE": "x", "REF": "${HOME}"}
    assert kept["h"]["url"] == "https://h/mcp?api_key=WITHHELD&x=1"
    assert kept["h"]["headers"] == {"Authorization": WITHHELD, "X-Trace": "on"}
    back = restored(kept)
    assert withheld(back["s"]) == ["argument 2", "argument 3", "argument 6", "env GITHUB_TOKEN"]
    assert withheld(back["h"]) == ["header Authorization"]
    assert restored({"bad__name": {"command": "x"}, "ok": {"nonsense": 1}}) == {}


def test_secrets_are_cut_out_of_what_is_said_about_a_server() -> None:
    server = McpServerConfig(
        command="srv", args=["--token", "abcdef123"], env={"API_KEY": "${MY_KEY}"}, headers={}
    )
    secrets = secret_values(server, {"MY_KEY": "expanded-secret-9"})
    text = "failed: usage srv --token abcdef123 (key expanded-secret-9)"
    assert scrub(text, secrets) == "failed: usage srv --token <withheld> (key <withheld>)"
    assert expand("a ${X} b", {"X": "1"}) == "a 1 b"
    with pytest.raises(KeyError):
        expand("${MISSING}", {})
