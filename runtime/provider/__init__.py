"""The local OpenAI-compatible provider that ships with agentcell (design §7.3).

It is what the demo, the tests and the benchmarks talk to over real HTTP through litellm: deterministic
scripted or policy-driven replies (text, reasoning, tool calls), exact usage counted with tiktoken, a
configurable context window answered with each vendor's real overflow error, and injected latency and
faults. Start it in-process with :class:`LocalProvider` or from a shell with ``agentcell provider``.
"""

from __future__ import annotations

from runtime.provider.chat_api import DEFAULT_MODEL
from runtime.provider.cli import cli_main
from runtime.provider.errors import OVERFLOW_FORMATS, ErrorResponse, overflow_error
from runtime.provider.script import FAULT_KINDS, Fault, FaultKind, ToolCallSpec, Turn, load_scripts
from runtime.provider.server import LocalProvider, LoggedRequest
from runtime.provider.usage import TokenCounter

__all__ = [
    "DEFAULT_MODEL",
    "FAULT_KINDS",
    "OVERFLOW_FORMATS",
    "ErrorResponse",
    "Fault",
    "FaultKind",
    "LocalProvider",
    "LoggedRequest",
    "TokenCounter",
    "ToolCallSpec",
    "Turn",
    "cli_main",
    "load_scripts",
    "overflow_error",
]
