"""Frames between the parent and its children: a 4-byte length, then a JSON object.

The parent reads non-blockingly through FrameReader; children write with send_frame.
"""

from __future__ import annotations

import json
import socket
import struct
from typing import Any

_HEADER = struct.Struct("!I")
MAX_FRAME = 64 * 1024 * 1024  # a result or checkpoint larger than this is refused


class FrameTooLarge(ValueError):
    pass


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_FRAME:
        raise FrameTooLarge(
            f"{len(body):,} bytes as JSON, over the {MAX_FRAME // (1024 * 1024)} MiB limit"
        )
    return _HEADER.pack(len(body)) + body


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(encode(message))


class FrameReader:
    """Accumulates bytes and yields complete messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        self._buffer += data
        messages = []
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME:
                raise FrameTooLarge(f"peer announced a frame of {length} bytes")
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            messages.append(json.loads(self._buffer[_HEADER.size : end]))
            del self._buffer[:end]
        return messages


def recv_frame(
    sock: socket.socket, reader: FrameReader, pending: list[dict[str, Any]]
) -> dict[str, Any] | None:
    """Blocking read of the next message (None at EOF); `pending` keeps extra ones."""
    while not pending:
        data = sock.recv(65536)
        if not data:
            return None
        pending.extend(reader.feed(data))
    return pending.pop(0)
