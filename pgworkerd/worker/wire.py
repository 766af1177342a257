"""Frames between the parent and its children: a 4-byte length, then a JSON object.

What goes in the frames is pgworkerd.worker.protocol's; the parent reads them
non-blockingly through FrameReader, the child's monitor thread too.
"""

from __future__ import annotations

import json
import struct
from typing import Any

_HEADER = struct.Struct("!I")
MAX_FRAME = 64 * 1024 * 1024  # a result or checkpoint larger than this is refused
_DECODER = json.JSONDecoder()


class FrameTooLarge(ValueError):
    pass


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":"), allow_nan=False).encode()
    if len(body) > MAX_FRAME:
        raise FrameTooLarge(
            f"{len(body):,} bytes as JSON, over the {MAX_FRAME // (1024 * 1024)} MiB limit"
        )
    return _HEADER.pack(len(body)) + body


class FrameReader:
    """Accumulates bytes and yields complete messages."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[dict[str, Any]]:
        buffer = self._buffer
        buffer += data
        messages = []
        start, size = 0, len(buffer)
        while size - start >= _HEADER.size:
            (length,) = _HEADER.unpack_from(buffer, start)
            if length > MAX_FRAME:
                raise FrameTooLarge(f"peer announced a frame of {length} bytes")
            end = start + _HEADER.size + length
            if size < end:
                break
            # Frames are UTF-8 (encode() above): decoded here, not by json.loads's
            # encoding detection (a tenth of the parent's time per short job went there).
            text = buffer[start + _HEADER.size : end].decode("utf-8", "surrogatepass")
            messages.append(_DECODER.decode(text))
            start = end
        if start:
            del buffer[:start]  # once per read, not once per frame
        return messages
