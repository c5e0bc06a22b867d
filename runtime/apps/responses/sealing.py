"""Reasoning sealed into ``encrypted_content``: an opaque token a client keeps and sends back (pure, no I/O).

A client that asks for ``include: ["reasoning.encrypted_content"]`` and keeps its own history (``store:
false``, Codex) gets each reasoning item with an ``encrypted_content``: the message's reasoning parts (text,
the provider's signature, redacted blocks) encrypted and authenticated with the server's key (AES-256-GCM,
the nonce derived from the
content with the key, so one reasoning always seals to one token: a stream's item and the stored one agree). Sent back in an input's ``reasoning`` item, the token is opened into those
parts again, so the model sees its reasoning as it made it; a token that was altered, or made with another
key, is refused (:class:`SealError`), never half-read.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Sequence
from typing import Final

import msgspec

from runtime.errors import AgentcellError
from runtime.messages import ReasoningPart

_VERSION: Final = b"ac1"
_parts = msgspec.json.Decoder(list[ReasoningPart])
_encode = msgspec.json.Encoder()


class SealError(AgentcellError, ValueError):
    """A token that does not open with this server's key."""


class Sealer:
    """Seals and opens reasoning with one 32-byte ``key``."""

    def __init__(self, key: bytes) -> None:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        if len(key) != 32:
            raise ValueError("the sealing key is 32 bytes")
        self._aead = AESGCM(key)
        self._nonce_key = hmac.new(key, b"agentcell nonce", hashlib.sha256).digest()

    def seal(self, parts: Sequence[ReasoningPart]) -> str:
        return self.seal_bytes(_encode.encode(list(parts)), b"reasoning")

    def open(self, token: str) -> list[ReasoningPart]:
        try:
            return _parts.decode(self.open_bytes(token, b"reasoning"))
        except msgspec.DecodeError:
            raise SealError("encrypted_content does not hold reasoning") from None

    def seal_bytes(self, plain: bytes, purpose: bytes) -> str:
        """``plain`` sealed for ``purpose`` (a token sealed for one purpose does not open for another)."""
        nonce = hmac.new(self._nonce_key, purpose + b"\0" + plain, hashlib.sha256).digest()[
            :12
        ]  # (SIV-style)
        sealed = self._aead.encrypt(nonce, plain, b"agentcell " + purpose + b" v1")
        return (_VERSION + base64.urlsafe_b64encode(nonce + sealed)).decode()

    def open_bytes(self, token: str, purpose: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        raw = token.encode()
        if not raw.startswith(_VERSION):
            raise SealError("encrypted_content was not made by this server")
        try:
            data = base64.urlsafe_b64decode(raw[len(_VERSION) :])
            return self._aead.decrypt(data[:12], data[12:], b"agentcell " + purpose + b" v1")
        except (InvalidTag, ValueError):
            raise SealError("encrypted_content does not open with this server's key (altered?)") from None
