"""Flutter's platform-channel codecs, byte-exact with Flutter's (and Switchboard's Swift and JavaScript) codecs.

Values of the standard codec in Python:

==========================  ==============================================================
Python                      StandardMessageCodec
==========================  ==============================================================
``None``, ``True/False``    null (0), true/false (1/2)
``int``                     int32 (3) when it fits, else int64 (4), as Flutter writes ints;
                            beyond 64 bits: :class:`FormatError`
:class:`Int64`              int64 (4) always; every int64 decodes to an ``Int64``
``float``                   float64 (6), NaN payloads and -0.0 kept
``str``                     string (7); the legacy large int (5) decodes to its digits
``bytes`` (``bytearray``,   Uint8List (8); decodes to ``bytes``
``memoryview``)
``array.array('i')``        Int32List (9)
``array.array('q')``        Int64List (10)
``array.array('d')``        Float64List (11)
``array.array('f')``        Float32List (14)
``list``, ``tuple``         list (12); decodes to ``list``
``dict`` (any Mapping)      map (13), in the dict's order; decodes to ``dict``
:class:`MapEntries`         map (13); what a map decodes to when a dict cannot hold its keys
==========================  ==============================================================

Typed lists decode to ``array.array`` with the type codes above, read from their bytes unchanged
(a Float32List's NaN payloads too). Decoding and re-encoding a canonical message therefore gives back
its bytes: int64 stays :class:`Int64`, map order stays the dict's order, and a map whose keys a
``dict`` cannot hold faithfully (unhashable keys such as lists, maps or typed lists, or keys equal in
Python but distinct on the wire, such as ``1`` and ``True`` or ``1`` and ``1.0``) decodes to a
:class:`MapEntries`, a list of ``(key, value)`` pairs, with list keys as lists.

Lists and maps nested deeper than :data:`MAX_NESTING_DEPTH` are an error in every codec, both ways.
They are walked without recursion, so Python's recursion limit never decides it.
"""

from __future__ import annotations

import array
import json
import json.decoder
import math
import re
import struct
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Optional

from .errors import FormatError, PlatformException

__all__ = [
    "MAX_NESTING_DEPTH", "Int64", "MapEntries", "MethodCall", "WriteBuffer", "ReadBuffer",
    "MessageCodec", "MethodCodec",
    "StandardMessageCodec", "StandardMethodCodec", "JSONMessageCodec", "JSONMethodCodec", "StringCodec", "BinaryCodec",
]

#: Nesting of lists and maps deeper than this is an error, in every codec (as on the server).
MAX_NESTING_DEPTH = 1000

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1


class Int64(int):
    """An int written as int64 even when it fits in 32 bits; every int64 decodes to one.

    It is an ``int`` in every other way: ``Int64(5) == 5``.
    """

    def __new__(cls, value: int = 0) -> "Int64":
        self = super().__new__(cls, value)
        if not _INT64_MIN <= self <= _INT64_MAX:
            raise FormatError(f"{int(self)} does not fit in 64 bits")
        return self

    def __repr__(self) -> str:
        return f"Int64({int(self)})"


class MapEntries(list):
    """A map as a list of ``(key, value)`` pairs, in order: for keys a ``dict`` cannot hold."""

    def __repr__(self) -> str:
        return f"MapEntries({list.__repr__(self)})"


@dataclass(frozen=True)
class MethodCall:
    """Flutter's MethodCall: a method name and its arguments."""

    method: str
    arguments: Any = None


def _typecode(kind: str, size: int) -> str:
    """The array type code of `size`-byte items of `kind` ('i' signed, 'f' float) on this platform."""
    for code in ("i", "q", "l") if kind == "i" else ("f", "d"):
        if array.array(code).itemsize == size:
            return code
    raise ImportError(f"no array type code for {size}-byte items of kind {kind}")


INT32_TYPECODE = _typecode("i", 4)
INT64_TYPECODE = _typecode("i", 8)
FLOAT32_TYPECODE = _typecode("f", 4)
FLOAT64_TYPECODE = _typecode("f", 8)
_BIG_ENDIAN_HOST = sys.byteorder == "big"


# MARK: Buffers

class WriteBuffer:
    """A growable little-endian byte buffer: Flutter's WriteBuffer. Alignment counts from its first byte."""

    __slots__ = ("_bytes", "depth")

    def __init__(self) -> None:
        self._bytes = bytearray()
        self.depth = 0

    def __len__(self) -> int:
        return len(self._bytes)

    def put_uint8(self, value: int) -> None:
        self._bytes.append(value)

    def put_uint16(self, value: int) -> None:
        self._bytes += struct.pack("<H", value)

    def put_uint32(self, value: int) -> None:
        self._bytes += struct.pack("<I", value)

    def put_int32(self, value: int) -> None:
        self._bytes += struct.pack("<i", value)

    def put_int64(self, value: int) -> None:
        self._bytes += struct.pack("<q", value)

    def put_float64(self, value: float) -> None:
        self.align_to(8)
        self._bytes += struct.pack("<d", value)

    def put_bytes(self, data: bytes) -> None:
        self._bytes += data

    def put_typed_list(self, items: array.array, alignment: int) -> None:
        """Aligns, then writes the items' bytes little-endian."""
        self.align_to(alignment)
        if _BIG_ENDIAN_HOST:
            items = array.array(items.typecode, items)
            items.byteswap()
        self._bytes += items.tobytes()

    def align_to(self, alignment: int) -> None:
        """Zero bytes up to a multiple of `alignment` from the start."""
        remainder = len(self._bytes) % alignment
        if remainder:
            self._bytes += bytes(alignment - remainder)

    def enter(self) -> None:
        """Enters one level of list or map nesting."""
        self.depth += 1
        if self.depth > MAX_NESTING_DEPTH:
            raise FormatError(f"nesting deeper than {MAX_NESTING_DEPTH} levels")

    def leave(self) -> None:
        self.depth -= 1

    def done(self) -> bytes:
        """The bytes written."""
        return bytes(self._bytes)


class ReadBuffer:
    """Reads little-endian values with a bounds check before every read: Flutter's ReadBuffer."""

    __slots__ = ("data", "position", "depth")

    def __init__(self, data: bytes) -> None:
        self.data = bytes(data)
        self.position = 0
        self.depth = 0

    @property
    def remaining(self) -> int:
        return len(self.data) - self.position

    def take(self, count: int) -> int:
        """Advances past `count` bytes and returns where they start."""
        if count > self.remaining:
            raise FormatError(f"needs {count} bytes, {self.remaining} remain", self.position)
        start = self.position
        self.position += count
        return start

    def _unpack(self, fmt: str, size: int) -> Any:
        return struct.unpack_from(fmt, self.data, self.take(size))[0]

    def get_uint8(self) -> int:
        return self.data[self.take(1)]

    def get_uint16(self) -> int:
        return self._unpack("<H", 2)

    def get_uint32(self) -> int:
        return self._unpack("<I", 4)

    def get_int32(self) -> int:
        return self._unpack("<i", 4)

    def get_int64(self) -> int:
        return self._unpack("<q", 8)

    def get_float64(self) -> float:
        self.align_to(8)
        return self._unpack("<d", 8)

    def get_bytes(self, count: int) -> bytes:
        start = self.take(count)
        return self.data[start:start + count]

    def get_typed_list(self, count: int, typecode: str, alignment: int) -> array.array:
        """Aligns, checks that `count` items remain (before allocating), reads them."""
        self.align_to(alignment)
        width = array.array(typecode).itemsize
        if count > self.remaining // width:
            raise FormatError(f"{count} items of {width} bytes exceed the {self.remaining} bytes left", self.position)
        items = array.array(typecode)
        items.frombytes(self.get_bytes(count * width))
        if _BIG_ENDIAN_HOST:
            items.byteswap()
        return items

    def align_to(self, alignment: int) -> None:
        """Skips padding up to a multiple of `alignment` from the start."""
        remainder = self.position % alignment
        if remainder:
            self.take(alignment - remainder)

    def enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING_DEPTH:
            raise FormatError(f"nesting deeper than {MAX_NESTING_DEPTH} levels", self.position)

    def leave(self) -> None:
        self.depth -= 1

    def expect_end(self, what: str) -> None:
        """Raises unless every byte has been read."""
        if self.remaining:
            raise FormatError(f"{self.remaining} bytes left over after the {what}", self.position)


# MARK: Codec interfaces

class MessageCodec:
    """Encodes messages to payloads and back. ``None`` as a payload is a NULL_PAYLOAD."""

    def encode_message(self, message: Any) -> Optional[bytes]:
        raise NotImplementedError

    def decode_message(self, payload: Optional[bytes]) -> Any:
        raise NotImplementedError


class MethodCodec:
    """Encodes method calls and result envelopes."""

    def encode_method_call(self, call: MethodCall) -> bytes:
        raise NotImplementedError

    def decode_method_call(self, payload: Optional[bytes]) -> MethodCall:
        raise NotImplementedError

    def encode_success_envelope(self, result: Any) -> bytes:
        raise NotImplementedError

    def encode_error_envelope(self, code: str, message: Optional[str] = None, details: Any = None,
                              stacktrace: Optional[str] = None) -> bytes:
        raise NotImplementedError

    def decode_envelope(self, payload: Optional[bytes]) -> Any:
        """The result of a success envelope; an error envelope raises its :class:`PlatformException`."""
        raise NotImplementedError


# MARK: Standard codecs

_NULL, _TRUE, _FALSE, _INT32, _INT64, _LARGE_INT, _FLOAT64, _STRING, _UINT8_LIST = range(9)
_INT32_LIST, _INT64_LIST, _FLOAT64_LIST, _LIST, _MAP, _FLOAT32_LIST = range(9, 15)

#: array type code → (type byte, alignment): every signed int code of 4 or 8 bytes, and both float codes
_TYPED_LISTS = {
    code: {(True, 4): (_INT32_LIST, 4), (True, 8): (_INT64_LIST, 8),
           (False, 4): (_FLOAT32_LIST, 4), (False, 8): (_FLOAT64_LIST, 8)}[(code in "ilq", array.array(code).itemsize)]
    for code in "ilqfd" if array.array(code).itemsize in (4, 8)
}
#: type byte → (array type code, alignment)
_TYPED_LIST_TYPES = {
    _INT32_LIST: (INT32_TYPECODE, 4), _INT64_LIST: (INT64_TYPECODE, 8),
    _FLOAT64_LIST: (FLOAT64_TYPECODE, 8), _FLOAT32_LIST: (FLOAT32_TYPECODE, 4),
}


def _is_container(value: Any) -> bool:
    return isinstance(value, (list, tuple, Mapping))


def _entries(value: Any) -> list:
    return list(value) if isinstance(value, MapEntries) else list(value.items())


class _MapBuilder:
    """The entries of a map being decoded; becomes a dict when a dict holds them faithfully."""

    __slots__ = ("pairs",)

    def __init__(self) -> None:
        self.pairs: list = []

    def build(self) -> Any:
        try:
            result = dict(self.pairs)
        except TypeError:  # an unhashable key
            return MapEntries(self.pairs)
        if len(result) != len(self.pairs):
            return MapEntries(self.pairs)  # keys equal in Python (1, True, 1.0), or repeated on the wire
        return result


class StandardMessageCodec(MessageCodec):
    """Flutter's StandardMessageCodec.

    Extend it as Flutter's: override :meth:`write_value` (for a custom value write a type byte >= 128
    and its body, else call ``super().write_value``) and :meth:`read_value_of_type` (likewise). Lists
    and maps are walked by the codec itself, without recursion; it calls these two for every other value.
    """

    def encode_message(self, message: Any) -> bytes:
        """The value's bytes; ``None`` is the single byte 00 (never a NULL_PAYLOAD)."""
        buffer = WriteBuffer()
        self.write_value(buffer, message)
        return buffer.done()

    def decode_message(self, payload: Optional[bytes]) -> Any:
        """One value; a NULL_PAYLOAD or empty payload is ``None``; bytes left over are an error."""
        if not payload:
            return None
        buffer = ReadBuffer(payload)
        value = self.read_value(buffer)
        buffer.expect_end("value")
        return value

    # Writing

    def write_value(self, buffer: WriteBuffer, value: Any) -> None:
        """Writes a type byte and the value's body."""
        if _is_container(value):
            self._write_container(buffer, value)
        elif value is None:
            buffer.put_uint8(_NULL)
        elif value is True:
            buffer.put_uint8(_TRUE)
        elif value is False:
            buffer.put_uint8(_FALSE)
        elif isinstance(value, Int64):
            buffer.put_uint8(_INT64)
            buffer.put_int64(value)
        elif isinstance(value, int):
            if _INT32_MIN <= value <= _INT32_MAX:
                buffer.put_uint8(_INT32)
                buffer.put_int32(value)
            elif _INT64_MIN <= value <= _INT64_MAX:
                buffer.put_uint8(_INT64)
                buffer.put_int64(value)
            else:
                raise FormatError(f"{value} does not fit in 64 bits")
        elif isinstance(value, float):
            buffer.put_uint8(_FLOAT64)
            buffer.put_float64(value)
        elif isinstance(value, str):
            data = _utf8(value)
            buffer.put_uint8(_STRING)
            self.write_size(buffer, len(data))
            buffer.put_bytes(data)
        elif isinstance(value, (bytes, bytearray, memoryview)):
            data = bytes(value)
            buffer.put_uint8(_UINT8_LIST)
            self.write_size(buffer, len(data))
            buffer.put_bytes(data)
        elif isinstance(value, array.array) and value.typecode in _TYPED_LISTS:
            type_byte, alignment = _TYPED_LISTS[value.typecode]
            buffer.put_uint8(type_byte)
            self.write_size(buffer, len(value))
            buffer.put_typed_list(value, alignment)
        elif isinstance(value, array.array) and value.typecode == "B":
            self.write_value(buffer, value.tobytes())
        else:
            raise FormatError(f"the standard codec cannot encode {type(value).__name__}")

    def _write_container(self, buffer: WriteBuffer, value: Any) -> None:
        """Writes a list or map and everything inside it, with an explicit stack instead of recursion."""
        stack: list = []
        base_depth = buffer.depth
        item: Any = value
        while True:
            if _is_container(item):
                buffer.enter()
                is_map = isinstance(item, (Mapping, MapEntries))
                elements = _entries(item) if is_map else item
                buffer.put_uint8(_MAP if is_map else _LIST)
                self.write_size(buffer, len(elements))
                stack.append((iter(elements), is_map, []))
            else:
                self.write_value(buffer, item)
            # Find the next item to write, leaving finished containers.
            while stack:
                elements, is_map, pending = stack[-1]
                if pending:
                    item = pending.pop()
                    break
                entry = next(elements, _END)
                if entry is _END:
                    stack.pop()
                    buffer.leave()
                    continue
                if is_map:
                    key, item = entry
                    pending.append(item)
                    item = key
                else:
                    item = entry
                break
            else:
                assert buffer.depth == base_depth
                return

    def write_size(self, buffer: WriteBuffer, size: int) -> None:
        """Writes a size: one byte below 254, else 254 + u16 or 255 + u32."""
        if size < 254:
            buffer.put_uint8(size)
        elif size <= 0xFFFF:
            buffer.put_uint8(254)
            buffer.put_uint16(size)
        elif size <= 0xFFFFFFFF:
            buffer.put_uint8(255)
            buffer.put_uint32(size)
        else:
            raise FormatError(f"size {size} does not fit in 32 bits")

    # Reading

    def read_value(self, buffer: ReadBuffer) -> Any:
        """Reads a type byte and the value it announces."""
        return self.read_value_of_type(buffer.get_uint8(), buffer)

    def read_value_of_type(self, type_byte: int, buffer: ReadBuffer) -> Any:
        """Reads the body of a value of `type_byte` (the type byte is already read)."""
        if type_byte == _NULL:
            return None
        if type_byte == _TRUE:
            return True
        if type_byte == _FALSE:
            return False
        if type_byte == _INT32:
            return buffer.get_int32()
        if type_byte == _INT64:
            return Int64(buffer.get_int64())
        if type_byte == _FLOAT64:
            return buffer.get_float64()
        if type_byte in (_STRING, _LARGE_INT):
            start = buffer.position
            return _utf8_decode(buffer.get_bytes(self.read_size(buffer)), start)
        if type_byte == _UINT8_LIST:
            return buffer.get_bytes(self.read_size(buffer))
        if type_byte in _TYPED_LIST_TYPES:
            typecode, alignment = _TYPED_LIST_TYPES[type_byte]
            return buffer.get_typed_list(self.read_size(buffer), typecode, alignment)
        if type_byte in (_LIST, _MAP):
            return self._read_container(type_byte, buffer)
        raise FormatError(f"unknown type byte {type_byte}", buffer.position - 1)

    def _read_container(self, type_byte: int, buffer: ReadBuffer) -> Any:
        """Reads a list or map and everything inside it, with an explicit stack instead of recursion."""
        stack: list = []  # [container, items still to read]
        while True:
            if type_byte in (_LIST, _MAP):
                is_map = type_byte == _MAP
                count = self._read_count(buffer, 2 if is_map else 1)
                buffer.enter()
                stack.append([_MapBuilder() if is_map else [], 2 * count if is_map else count, None])
                value = _PENDING
            else:
                value = self.read_value_of_type(type_byte, buffer)
            # Place the value, closing every container it completes.
            while stack:
                frame = stack[-1]
                container = frame[0]
                if value is not _PENDING:
                    if isinstance(container, list):
                        container.append(value)
                    elif frame[2] is None:
                        frame[2] = (value,)  # a key, waiting for its value
                    else:
                        container.pairs.append((frame[2][0], value))
                        frame[2] = None
                    frame[1] -= 1
                if frame[1] > 0:
                    break
                stack.pop()
                buffer.leave()
                value = container.build() if isinstance(container, _MapBuilder) else container
            else:
                return value
            type_byte = buffer.get_uint8()

    def read_size(self, buffer: ReadBuffer) -> int:
        """Reads a size (1, 3 or 5 bytes)."""
        first = buffer.get_uint8()
        if first < 254:
            return first
        return buffer.get_uint16() if first == 254 else buffer.get_uint32()

    def _read_count(self, buffer: ReadBuffer, width: int) -> int:
        """Reads a count of elements taking at least `width` bytes each, refusing counts the payload cannot hold."""
        count = self.read_size(buffer)
        if count > buffer.remaining // width:
            raise FormatError(f"{count} elements exceed the {buffer.remaining} bytes left", buffer.position)
        return count


_END = object()
_PENDING = object()


class StandardMethodCodec(MethodCodec):
    """Flutter's StandardMethodCodec: calls are name + arguments; envelopes start with 0 (success) or 1 (error)."""

    def __init__(self, message_codec: Optional[StandardMessageCodec] = None) -> None:
        self.message_codec = message_codec or StandardMessageCodec()

    def encode_method_call(self, call: MethodCall) -> bytes:
        if not isinstance(call.method, str):
            raise FormatError("the method name must be a string")
        buffer = WriteBuffer()
        self.message_codec.write_value(buffer, call.method)
        self.message_codec.write_value(buffer, call.arguments)
        return buffer.done()

    def decode_method_call(self, payload: Optional[bytes]) -> MethodCall:
        buffer = _reader(payload, "method call")
        method = self.message_codec.read_value(buffer)
        if not isinstance(method, str):
            raise FormatError("the method name is not a string", 0)
        arguments = self.message_codec.read_value(buffer)
        buffer.expect_end("method call")
        return MethodCall(method, arguments)

    def encode_success_envelope(self, result: Any) -> bytes:
        buffer = WriteBuffer()
        buffer.put_uint8(0)
        self.message_codec.write_value(buffer, result)
        return buffer.done()

    def encode_error_envelope(self, code: str, message: Optional[str] = None, details: Any = None,
                              stacktrace: Optional[str] = None) -> bytes:
        """An error envelope: 4 fields only when a stack trace is given."""
        buffer = WriteBuffer()
        buffer.put_uint8(1)
        for field in (code, message, details) + ((stacktrace,) if stacktrace is not None else ()):
            self.message_codec.write_value(buffer, field)
        return buffer.done()

    def decode_envelope(self, payload: Optional[bytes]) -> Any:
        buffer = _reader(payload, "envelope")
        kind = buffer.get_uint8()
        if kind == 0:
            value = self.message_codec.read_value(buffer)
            buffer.expect_end("envelope")
            return value
        if kind != 1:
            raise FormatError(f"an envelope starts with 0 or 1, not {kind}", 0)
        code = self.message_codec.read_value(buffer)
        if not isinstance(code, str):
            raise FormatError("the error code is not a string", buffer.position)
        message = self._optional_string(buffer, "message")
        details = self.message_codec.read_value(buffer)
        stacktrace = self._optional_string(buffer, "stack trace") if buffer.remaining else None
        buffer.expect_end("envelope")
        raise PlatformException(code, message, details, stacktrace)

    def _optional_string(self, buffer: ReadBuffer, what: str) -> Optional[str]:
        value = self.message_codec.read_value(buffer)
        if value is not None and not isinstance(value, str):
            raise FormatError(f"the error {what} is not a string or null", buffer.position)
        return value


def _reader(payload: Optional[bytes], what: str) -> ReadBuffer:
    if payload is None:
        raise FormatError(f"a null payload where a {what} was expected")
    return ReadBuffer(payload)


# MARK: String and binary

def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as error:  # lone surrogates
        raise FormatError(f"not encodable as UTF-8: {error.reason}") from None


def _utf8_decode(data: bytes, offset: Optional[int] = None) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise FormatError("invalid UTF-8", offset) from None


class StringCodec(MessageCodec):
    """Flutter's StringCodec: UTF-8 text; ``None`` is a NULL_PAYLOAD."""

    def encode_message(self, message: Optional[str]) -> Optional[bytes]:
        return None if message is None else _utf8(message)

    def decode_message(self, payload: Optional[bytes]) -> Optional[str]:
        return None if payload is None else _utf8_decode(bytes(payload))


class BinaryCodec(MessageCodec):
    """Flutter's BinaryCodec: the payload is the message (``bytes``); ``None`` is a NULL_PAYLOAD."""

    def encode_message(self, message: Optional[bytes]) -> Optional[bytes]:
        return None if message is None else bytes(message)

    def decode_message(self, payload: Optional[bytes]) -> Optional[bytes]:
        return None if payload is None else bytes(payload)


# MARK: JSON codecs

class JSONMessageCodec(MessageCodec):
    """Flutter's JSONMessageCodec: UTF-8 JSON; ``None`` is a NULL_PAYLOAD. Objects decode to dicts, in order."""

    def encode_message(self, message: Any) -> Optional[bytes]:
        return None if message is None else to_json(message).encode("utf-8")

    def decode_message(self, payload: Optional[bytes]) -> Any:
        return None if payload is None else parse_json(payload)


class JSONMethodCodec(MethodCodec):
    """Flutter's JSONMethodCodec: calls ``{"method":..,"args":..}``, envelopes ``[result]`` or
    ``[code, message, details(, stacktrace)]``."""

    def encode_method_call(self, call: MethodCall) -> bytes:
        if not isinstance(call.method, str):
            raise FormatError("the method name must be a string")
        return to_json({"method": call.method, "args": call.arguments}).encode("utf-8")

    def decode_method_call(self, payload: Optional[bytes]) -> MethodCall:
        call = parse_json(_non_null(payload, "method call"))
        if not isinstance(call, dict) or not isinstance(call.get("method"), str):
            raise FormatError("invalid method call")
        return MethodCall(call["method"], call.get("args"))

    def encode_success_envelope(self, result: Any) -> bytes:
        return to_json([result]).encode("utf-8")

    def encode_error_envelope(self, code: str, message: Optional[str] = None, details: Any = None,
                              stacktrace: Optional[str] = None) -> bytes:
        fields = [code, message, details] + ([stacktrace] if stacktrace is not None else [])
        return to_json(fields).encode("utf-8")

    def decode_envelope(self, payload: Optional[bytes]) -> Any:
        fields = parse_json(_non_null(payload, "envelope"))
        if not isinstance(fields, list):
            raise FormatError("an envelope is a JSON array")
        if len(fields) == 1:
            return fields[0]
        if len(fields) not in (3, 4):
            raise FormatError("invalid envelope")
        code, message, details = fields[:3]
        stacktrace = fields[3] if len(fields) == 4 else None
        if not isinstance(code, str) or not all(v is None or isinstance(v, str) for v in (message, stacktrace)):
            raise FormatError("invalid envelope")
        raise PlatformException(code, message, details, stacktrace)


def _non_null(payload: Optional[bytes], what: str) -> bytes:
    if payload is None:
        raise FormatError(f"a null payload where a {what} was expected")
    return payload


def to_json(value: Any) -> str:
    """Compact JSON text of a value: dict keys must be strings; bytes and typed lists become arrays of numbers;
    NaN and infinities have no JSON form. Nesting deeper than MAX_NESTING_DEPTH is an error."""
    out: list = []
    stack: list = []  # (iterator, is_map, closing bracket)
    item: Any = value
    while True:
        if isinstance(item, (bytes, bytearray, memoryview, array.array)):
            item = list(item)
        if isinstance(item, (list, tuple, Mapping)):
            if len(stack) >= MAX_NESTING_DEPTH:
                raise FormatError(f"nesting deeper than {MAX_NESTING_DEPTH} levels")
            is_map = isinstance(item, Mapping)
            out.append("{" if is_map else "[")
            stack.append((iter(item.items() if is_map else item), is_map, "}" if is_map else "]", [True]))
        else:
            out.append(_json_scalar(item))
        while stack:
            elements, is_map, closing, first = stack[-1]
            entry = next(elements, _END)
            if entry is _END:
                out.append(closing)
                stack.pop()
                continue
            if not first[0]:
                out.append(",")
            first[0] = False
            if is_map:
                key, item = entry
                if not isinstance(key, str):
                    raise FormatError(f"JSON map keys must be strings, not {type(key).__name__}")
                out.append(json.dumps(key, ensure_ascii=False) + ":")
            else:
                item = entry
            break
        else:
            return "".join(out)


def _json_scalar(value: Any) -> str:
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(int(value))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FormatError(f"{value} has no JSON form")
        return repr(value)
    if isinstance(value, str):
        _utf8(value)
        return json.dumps(value, ensure_ascii=False)
    raise FormatError(f"JSON cannot encode {type(value).__name__}")


_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?")
_WHITESPACE = re.compile(r"[ \t\n\r]*")
_LITERALS = (("true", True), ("false", False), ("null", None))


def parse_json(payload: bytes) -> Any:
    """Parses UTF-8 JSON without recursion. Objects become dicts (entry order kept; a repeated key keeps its last
    value); nesting deeper than MAX_NESTING_DEPTH and anything after the value are errors."""
    text = _utf8_decode(bytes(payload))
    position = 0

    def fail(what: str) -> FormatError:
        return FormatError(f"invalid JSON: {what}", position)

    def skip(at: int) -> int:
        return _WHITESPACE.match(text, at).end()

    stack: list = []  # [container, key or None]
    while True:
        position = skip(position)
        char = text[position:position + 1]
        if char in ("[", "{"):
            if len(stack) >= MAX_NESTING_DEPTH:
                raise fail(f"nesting deeper than {MAX_NESTING_DEPTH} levels")
            position = skip(position + 1)
            container: Any = [] if char == "[" else {}
            closing = "]" if char == "[" else "}"
            if text[position:position + 1] == closing:
                position += 1
                value = container
            else:
                stack.append([container, None])
                if char == "{":
                    position = _read_key(text, position, stack[-1], fail)
                continue
        elif char == '"':
            try:
                value, position = json.decoder.scanstring(text, position + 1, True)
            except json.JSONDecodeError as error:
                raise fail(error.msg) from None
        else:
            for word, literal in _LITERALS:
                if text.startswith(word, position):
                    value = literal
                    position += len(word)
                    break
            else:
                match = _NUMBER.match(text, position)
                if not match:
                    raise fail("unexpected character" if char else "unexpected end")
                position = match.end()
                value = float(match.group()) if match.group(1) or match.group(2) else int(match.group())
        # Place the value, closing every container it completes.
        while stack:
            frame = stack[-1]
            container = frame[0]
            if isinstance(container, list):
                container.append(value)
            else:
                container[frame[1]] = value
            position = skip(position)
            char = text[position:position + 1]
            position += 1
            if char == ",":
                if isinstance(container, dict):
                    position = _read_key(text, skip(position), frame, fail)
                break
            if char != ("]" if isinstance(container, list) else "}"):
                position -= 1
                raise fail("expected ',' or a closing bracket")
            stack.pop()
            value = container
        else:
            if skip(position) != len(text):
                raise fail("data after the value")
            return value


def _read_key(text: str, position: int, frame: list, fail: Any) -> int:
    """Reads `"key" :` into the frame and returns the position after the colon."""
    if text[position:position + 1] != '"':
        raise fail("expected a string key")
    try:
        frame[1], position = json.decoder.scanstring(text, position + 1, True)
    except json.JSONDecodeError as error:
        raise fail(error.msg) from None
    position = _WHITESPACE.match(text, position).end()
    if text[position:position + 1] != ":":
        raise fail("expected ':'")
    return position + 1
