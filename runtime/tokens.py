"""Token counting (design §4.3, 4.4): exact with tiktoken, or a fast heuristic when exact counting is off.

A :class:`TokenCounter` counts for one model. It picks the model's tiktoken encoding (``o200k_base`` for
current OpenAI models, ``cl100k_base`` as the closest public tokenizer for everything else) and adds the
chat format's framing the way OpenAI documents it: every message costs 3 tokens plus its role, and the
reply is primed with 3 more. Counts are cached per message id, so estimating a turn tokenizes only the
messages that are new since the last turn.

With ``TokenConfig.exact`` off, :func:`heuristic_tokens` stands in for tiktoken: about 4 characters a
token for ASCII text (refined by character class, see below), ~1.3 tokens per non-ASCII character,
images at ``image_tokens`` and ``message_overhead`` tokens per message. A calibration ratio measured
against the provider's real counts can then scale every heuristic count (``apply_calibration``).

Encodings load lazily and are shared process-wide; ``import runtime`` points tiktoken at the files litellm
ships, so nothing here needs the network.
"""

from __future__ import annotations

import functools
import math
import re
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from runtime.config import ConfigError, TokenConfig
from runtime.messages import ImagePart, Message, ReasoningPart, TextPart, ToolCallPart

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "CL100K_BASE",
    "DEFAULT_CACHE_SIZE",
    "NON_ASCII_TOKENS",
    "O200K_BASE",
    "REPLY_PRIMING",
    "TOKENS_PER_MESSAGE",
    "TOOLS_OVERHEAD",
    "TokenCounter",
    "encoding_for_model",
    "get_encoding",
    "heuristic_tokens",
    "render_tools",
]


O200K_BASE: Final = "o200k_base"
CL100K_BASE: Final = "cl100k_base"

# The chat format's framing (OpenAI cookbook, "How to count tokens with tiktoken"): each message is
# rendered as <|start|>{role}<|message|>{content}<|end|>, three tokens plus the role's own tokens, and
# every reply is primed with <|start|>assistant<|message|>, three more.
TOKENS_PER_MESSAGE: Final = 3
REPLY_PRIMING: Final = 3
# Tool definitions are rendered into the prompt as a TypeScript-like namespace (see render_tools); the
# block's framing costs a few tokens beyond the rendered text.
TOOLS_OVERHEAD: Final = 9

# Models whose tokenizer is o200k_base: gpt-4o, gpt-4.1, gpt-4.5, gpt-5, the o-series, chatgpt-4o,
# gpt-oss and codex. Everything else, other providers included, gets cl100k_base.
_O200K_MODELS: Final = re.compile(
    r"(?:gpt-4o|chatgpt-4o|gpt-4\.1|gpt-4\.5|gpt-5|gpt-oss|o[1-9]|codex)(?:$|[-.:@_])"
)

DEFAULT_CACHE_SIZE: Final = 65_536


def encoding_for_model(model: str) -> str:
    """The tiktoken encoding to count ``model``'s tokens with.

    Provider prefixes (``openai/``, ``azure/``, ``openrouter/openai/``) and fine-tune prefixes (``ft:``)
    are ignored. Unknown models get ``cl100k_base``, the closest public tokenizer for most of them.
    """
    base = model.rsplit("/", 1)[-1].lower()
    base = base.removeprefix("ft:")
    return O200K_BASE if _O200K_MODELS.match(base) else CL100K_BASE


@functools.cache
def get_encoding(name: str) -> tiktoken.Encoding:
    """A tiktoken encoding, loaded once per process (tiktoken is imported on first use)."""
    import tiktoken

    try:
        return tiktoken.get_encoding(name)
    except ValueError:
        known = ", ".join(sorted(tiktoken.list_encoding_names()))
        raise ConfigError(f"tokens.encoding: unknown tiktoken encoding {name!r} (known: {known})") from None


# ---------------------------------------------------------------------------------------------------
# The heuristic
#
# "4 characters a token" is right on average but 15-30% high on English prose and 2x low on JSON and
# numbers. Counting by character class costs a few C-speed passes over the bytes and stays within ~15%
# of tiktoken on prose, code and data alike: about one token per word (a run of letters; at least one per
# 6 letters, for very long words), 3/4 per digit and per line break, 1/2 per punctuation mark (they often
# merge), 1/10 per space (a space usually joins the next word; runs of indentation do not).

NON_ASCII_TOKENS: Final = 1.3  # per non-ASCII character (CJK is ~0.6-1.5 tokens a character)
_TOKENS_PER_WORD: Final = 1.0
_MAX_LETTERS_PER_TOKEN: Final = 6
_TOKENS_PER_DIGIT: Final = 0.75
_TOKENS_PER_NEWLINE: Final = 0.75
_TOKENS_PER_PUNCT: Final = 0.5
_TOKENS_PER_SPACE: Final = 0.1


def _class_table() -> bytes:
    table = bytearray(b"p" * 256)  # punctuation, symbols and control characters
    for c in b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        table[c] = ord("a")
    for c in b"0123456789":
        table[c] = ord("d")
    for c in b" \t\r\f\v":
        table[c] = ord(" ")
    table[ord("\n")] = ord("\n")
    return bytes(table)


_CLASSES: Final = _class_table()
_LETTERS: Final = bytes(ord("a") if c == ord("a") else ord(" ") for c in _CLASSES)


def heuristic_tokens(text: str) -> int:
    """Approximate token count of ``text`` without a tokenizer (design §4.3)."""
    if not text:
        return 0
    raw = text.encode("ascii") if text.isascii() else text.encode("ascii", "ignore")
    non_ascii = len(text) - len(raw)
    classes = raw.translate(_CLASSES)
    letters = classes.count(b"a")
    # Words are runs of letters: count the starts of runs (the pattern cannot overlap itself).
    only_letters = raw.translate(_LETTERS)
    words = only_letters.count(b" a") + only_letters.startswith(b"a")
    ascii_tokens = (
        max(words * _TOKENS_PER_WORD, letters / _MAX_LETTERS_PER_TOKEN)
        + classes.count(b"d") * _TOKENS_PER_DIGIT
        + classes.count(b"\n") * _TOKENS_PER_NEWLINE
        + classes.count(b"p") * _TOKENS_PER_PUNCT
        + classes.count(b" ") * _TOKENS_PER_SPACE
    )
    return math.ceil(ascii_tokens + non_ascii * NON_ASCII_TOKENS)


# ---------------------------------------------------------------------------------------------------
# Tool definitions as the model sees them


def render_tools(tools: Iterable[Mapping[str, Any]]) -> str:
    """OpenAI tool schemas rendered the way OpenAI models see them: a TypeScript-like namespace.

    Accepts ``{"type": "function", "function": {...}}`` entries and bare function objects
    (``{"name", "description", "parameters"}``).
    """
    out = ["namespace functions {", ""]
    for tool in tools:
        function = tool.get("function", tool)
        if not isinstance(function, Mapping) or not function.get("name"):
            continue
        if function.get("description"):
            out.append(f"// {function['description']}")
        params = function.get("parameters")
        if isinstance(params, Mapping) and params.get("properties"):
            out.append(f"type {function['name']} = (_: {{")
            out.extend(_render_properties(params, depth=0))
            out.append("}) => any;")
        else:
            out.append(f"type {function['name']} = () => any;")
        out.append("")
    out.append("} // namespace functions")
    return "\n".join(out)


def _render_properties(schema: Mapping[str, Any], depth: int) -> list[str]:
    indent = "  " * depth
    required = set(schema.get("required") or ())
    lines: list[str] = []
    for name, prop in (schema.get("properties") or {}).items():
        prop = prop if isinstance(prop, Mapping) else {}
        if prop.get("description"):
            lines.append(f"{indent}// {prop['description']}")
        optional = "" if name in required else "?"
        lines.append(f"{indent}{name}{optional}: {_render_type(prop, depth)},")
    return lines


def _render_type(prop: Mapping[str, Any], depth: int) -> str:
    if "enum" in prop:
        return " | ".join(msgspec.json.encode(v).decode() for v in prop["enum"])
    kind = prop.get("type")
    if isinstance(kind, list):
        return " | ".join(_render_type({**prop, "type": k}, depth) for k in kind)
    if kind == "string":
        return "string"
    if kind in ("number", "integer"):
        return "number"
    if kind == "boolean":
        return "boolean"
    if kind == "null":
        return "null"
    if kind == "array":
        items = prop.get("items")
        return f"{_render_type(items, depth) if isinstance(items, Mapping) else 'any'}[]"
    if kind == "object" and prop.get("properties"):
        inner = "\n".join(_render_properties(prop, depth + 1))
        return f"{{\n{inner}\n{'  ' * depth}}}"
    if kind == "object":
        return "object"
    return "any"


# ---------------------------------------------------------------------------------------------------
# The counter


def _fingerprint(msg: Message) -> int:
    """A hash of everything a message's count depends on (its strings hash once: Python caches it)."""
    keys: list[Any] = [msg.role]
    for part in msg.parts:
        if isinstance(part, TextPart | ReasoningPart):
            keys.append(part.text)
        elif isinstance(part, ToolCallPart):
            keys.append((part.name, part.arguments))
        elif isinstance(part, ImagePart):
            keys.append(part.tokens)
    return hash(tuple(keys))


class TokenCounter:
    """Counts tokens of text, messages, tool schemas and system prompts for one model.

    ``config.encoding`` overrides the encoding chosen from the model name. With ``config.exact`` off,
    counts come from :func:`heuristic_tokens`, scaled by :attr:`calibration` when
    ``config.apply_calibration`` is on. ``tokenize`` (the server's own tokenizer: ``tokens.server_tokenize``)
    counts text first, when it answers. A counter is safe to share between threads (and sessions).
    """

    def __init__(
        self,
        model: str,
        config: TokenConfig | None = None,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        tokenize: Callable[[str], int | None] | None = None,
    ) -> None:
        self.model = model
        self._tokenize: Callable[[str], int | None] | None = None
        self.config = config if config is not None else TokenConfig()
        self.encoding_name = self.config.encoding or encoding_for_model(model)
        self.exact = self.config.exact
        self._encoding = get_encoding(self.encoding_name) if self.exact else None
        self._cache_size = max(1, cache_size)
        # message id -> (a weak reference to the message counted, a fingerprint of what was counted, the raw
        # count). An entry is dropped with its message (design §4.3): the cache holds the live contexts,
        # never a history; ``cache_size`` caps it besides (oldest out first).
        self._messages: dict[str, tuple[weakref.KeyedRef[str, Message], int, int]] = {}
        # references whose message died: their entries go at the next count
        self._dead: deque[weakref.KeyedRef[str, Message]] = deque()
        self._systems: dict[str, int] = {}
        self._tools: dict[str, int] = {}
        self._lock = threading.Lock()
        self._calibration = 1.0
        self._role_tokens = {role: self._raw_text(role) for role in ("system", "user", "assistant", "tool")}
        # the server's own count of a text (llama.cpp's /tokenize, ``tokens.server_tokenize``); its None: no
        # answer to be had, the text is counted here. The chat framing above stays counted here.
        self._tokenize = tokenize

    # -- calibration (design §4.4) -------------------------------------------------------------------------
    @property
    def calibration(self) -> float:
        """The factor applied to every count: the calibration ratio when it applies, else 1.0."""
        return self._calibration

    @property
    def calibrates(self) -> bool:
        """Whether a calibration ratio is applied (heuristic counting with ``apply_calibration`` on)."""
        return self.config.apply_calibration and not self.exact

    def set_calibration(self, ratio: float) -> None:
        """Apply ``ratio`` (actual ÷ estimated) to later counts, when :attr:`calibrates`. Clamped to 1/4..4."""
        if self.calibrates and math.isfinite(ratio) and ratio > 0:
            self._calibration = min(4.0, max(0.25, ratio))

    def _scaled(self, raw: int) -> int:
        return raw if self._calibration == 1.0 else round(raw * self._calibration)

    # -- counting ---------------------------------------------------------------------------------------
    def count_text(self, text: str) -> int:
        """Tokens of a plain string (no message framing)."""
        return self._scaled(self._raw_text(text))

    def count_message(self, msg: Message) -> int:
        """Tokens one message adds to a request: its content, reasoning, tool calls (names and arguments),
        images (``ImagePart.tokens`` when measured, else ``config.image_tokens``) and the per-message framing.

        Counts are cached by message id while the message lives (and checked against a fingerprint of what
        is counted, so a rewritten message with the same id is recounted).
        """
        key = msg.id
        cached = self._messages.get(key)
        if cached is not None and cached[0]() is msg:
            return self._scaled(cached[2])
        fingerprint = _fingerprint(msg)
        if cached is not None and cached[1] == fingerprint:
            return self._scaled(cached[2])
        raw = self._raw_message(msg)
        ref = weakref.KeyedRef(msg, self._dead.append, key)
        with self._lock:
            dead, entries = self._dead, self._messages
            while dead:  # entries of messages that died since
                gone = dead.popleft()
                entry = entries.get(gone.key)
                if entry is not None and entry[0] is gone:
                    del entries[gone.key]
            entries[key] = (ref, fingerprint, raw)
            while len(entries) > self._cache_size:
                del entries[next(iter(entries))]
        return self._scaled(raw)

    def count_messages(self, msgs: Iterable[Message]) -> int:
        """Tokens of a request's messages: the agent-visible ones, plus the reply priming."""
        return REPLY_PRIMING + sum(self.count_message(m) for m in msgs if m.agent_visible)

    def count_system(self, text: str) -> int:
        """Tokens of a system prompt sent as the request's system message (0 when there is none)."""
        if not text:
            return 0
        cached = self._systems.get(text)
        if cached is None:
            cached = self._framing("system") + self._raw_text(text)
            self._remember(self._systems, text, cached)
        return self._scaled(cached)

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens the tool definitions (OpenAI tool schemas) add to a request (0 when there are none)."""
        if not tools:
            return 0
        key = msgspec.json.encode(list(tools)).decode()
        cached = self._tools.get(key)
        if cached is None:
            cached = TOOLS_OVERHEAD + self._raw_text(render_tools(tools))
            self._remember(self._tools, key, cached)
        return self._scaled(cached)

    # -- internals --------------------------------------------------------------------------------------
    def _raw_text(self, text: str) -> int:
        if not text:
            return 0
        if self._tokenize is not None and (exact := self._tokenize(text)) is not None:
            return exact
        if self._encoding is not None:
            return len(self._encoding.encode_ordinary(text))
        return heuristic_tokens(text)

    def _framing(self, role: str) -> int:
        if self.exact:
            return TOKENS_PER_MESSAGE + self._role_tokens.get(role, 1)
        return self.config.message_overhead

    def _raw_message(self, msg: Message) -> int:
        n = self._framing(msg.role)
        for part in msg.parts:
            if isinstance(part, TextPart | ReasoningPart):
                n += self._raw_text(part.text)
            elif isinstance(part, ToolCallPart):
                n += self._raw_text(part.name) + self._raw_text(part.arguments)
            elif isinstance(part, ImagePart):
                n += part.tokens if part.tokens is not None else self.config.image_tokens
        return n

    def _remember(self, cache: dict[str, int], key: str, count: int) -> None:
        # System prompts and tool sets are few per model; a small cache that resets when full is enough.
        with self._lock:
            if len(cache) >= 256:
                cache.clear()
            cache[key] = count

    def __repr__(self) -> str:
        mode = self.encoding_name if self.exact else "heuristic"
        return f"TokenCounter(model={self.model!r}, counting={mode!r})"
