"""wire-v1 binary frames (protocol/wire.md): a 12-byte big-endian header, the channel name, the payload."""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass
from typing import Optional

from .errors import FormatError

__all__ = ["FrameType", "Frame", "HEADER_SIZE", "encode_frame", "parse_header"]

HEADER_SIZE = 12
NULL_PAYLOAD = 0x01
_HEADER = struct.Struct(">IBBHI")


class FrameType(enum.IntEnum):
    """Frame types of wire-v1 (section 2)."""

    HELLO = 0x01
    WELCOME = 0x02
    MESSAGE = 0x03
    REPLY = 0x04
    PING = 0x05
    PONG = 0x06
    ERROR = 0x07
    GOAWAY = 0x08
    REGISTER = 0x09
    UNREGISTER = 0x0A
    CANCEL = 0x0B
    DEMAND = 0x0C
    POSITION = 0x0D  # resumable sessions (protocol/resumption.md): a received position, u64
    END = 0x0E  # resumable sessions: the session ends


@dataclass(frozen=True)
class Frame:
    """One frame. ``payload`` None is a NULL_PAYLOAD, which is not the same as an empty payload."""

    type: int
    id: int = 0
    channel: str = ""
    payload: Optional[bytes] = None


def encode_frame(frame: Frame) -> bytes:
    """The frame's bytes; a None payload sets NULL_PAYLOAD."""
    name = frame.channel.encode("utf-8")
    if len(name) > 0xFFFF:
        raise FormatError(f"a channel name of {len(name)} bytes is over 65535")
    payload = b"" if frame.payload is None else bytes(frame.payload)
    flags = NULL_PAYLOAD if frame.payload is None else 0
    return _HEADER.pack(8 + len(name) + len(payload), frame.type, flags, len(name), frame.id) + name + payload


def parse_header(header: bytes) -> tuple:
    """``(length, type, flags, chanlen, id)`` of a 12-byte header; raises FormatError when it cannot be a frame."""
    length, frame_type, flags, chanlen, frame_id = _HEADER.unpack(header)
    if length < 8 or chanlen > length - 8:
        raise FormatError(f"malformed frame header: length {length}, channel {chanlen}")
    if flags & ~NULL_PAYLOAD:
        raise FormatError(f"reserved flag bits {flags:#x}")
    if flags & NULL_PAYLOAD and length - 8 - chanlen:
        raise FormatError("NULL_PAYLOAD with a payload")
    return length, frame_type, flags, chanlen, frame_id
