"""The codecs against the shared byte vectors (protocol/vectors/standard-codec.json), plus round trips."""

import array
import json
import math
import struct
from pathlib import Path

import pytest

import switchboard
from switchboard import (
    BinaryCodec, FormatError, Int64, JSONMessageCodec, JSONMethodCodec, MapEntries, MethodCall, PlatformException,
    StandardMessageCodec, StandardMethodCodec, StringCodec,
)

VECTORS_PATH = Path(__file__).resolve().parents[3] / "protocol" / "vectors" / "standard-codec.json"
VECTORS = json.loads(VECTORS_PATH.read_text())
messages = StandardMessageCodec()
methods = StandardMethodCodec()


def hex_bytes(text: str) -> bytes:
    """Bytes of a vector's hex: pairs of hex digits, spaces ignored, "zeros:N" = N zero bytes."""
    out = bytearray()
    for token in text.split():
        out += bytes(int(token[6:])) if token.startswith("zeros:") else bytes.fromhex(token)
    return bytes(out)


def double_of_bits(hex_bits: str) -> float:
    return struct.unpack(">d", bytes.fromhex(hex_bits))[0]


def bits_of_double(x: float) -> str:
    return struct.pack(">d", x).hex()


def py_value(tagged):
    """The Python value a tagged vector value stands for, as the encoder is given it."""
    [(tag, v)] = tagged.items()
    if tag in ("null", "bool", "int32", "string"):
        return v
    if tag == "int64":
        return Int64(int(v))
    if tag == "float64":
        return float(v)
    if tag == "float64Bits":
        return double_of_bits(v)
    if tag == "uint8List":
        return bytes(int(v[6:])) if isinstance(v, str) else bytes(v)
    if tag == "int32List":
        return array.array(switchboard.codec.INT32_TYPECODE, v)
    if tag == "int64List":
        return array.array(switchboard.codec.INT64_TYPECODE, [int(x) for x in v])
    if tag == "float32List":
        return array.array("f", v)
    if tag == "float64List":
        return array.array("d", v)
    if tag == "list":
        return [py_value(x) for x in v]
    if tag == "map":
        return {py_value(k): py_value(x) for k, x in v}
    raise AssertionError(f"unknown tag {tag}")


def assert_decoded(actual, tagged, path="value"):
    """Asserts that a decoded value is exactly what the tagged value says, types included."""
    [(tag, v)] = tagged.items()
    expected = py_value(tagged)
    if tag in ("float64", "float64Bits"):
        assert type(actual) is float, path
        assert bits_of_double(actual) == bits_of_double(expected), path
    elif tag == "list":
        assert type(actual) is list, path
        assert len(actual) == len(v), path
        for i, (a, t) in enumerate(zip(actual, v)):
            assert_decoded(a, t, f"{path}[{i}]")
    elif tag == "map":
        assert type(actual) is dict, path
        assert len(actual) == len(v), path
        for i, ((key, value), (tk, tv)) in enumerate(zip(actual.items(), v)):
            assert_decoded(key, tk, f"{path} key {i}")
            assert_decoded(value, tv, f"{path} value {i}")
    else:
        assert type(actual) is type(expected), path
        if isinstance(expected, array.array):
            assert actual.typecode == expected.typecode, path
        assert actual == expected, path


def named(vectors):
    return pytest.mark.parametrize("vector", vectors, ids=[v["name"] for v in vectors])


@named(VECTORS["messages"])
def test_message_vector(vector):
    assert messages.encode_message(py_value(vector["value"])) == hex_bytes(vector["hex"])
    assert_decoded(messages.decode_message(hex_bytes(vector["hex"])), vector["value"])


@named(VECTORS["messages"])
def test_message_vector_reencodes_to_its_bytes(vector):
    data = hex_bytes(vector["hex"])
    assert messages.encode_message(messages.decode_message(data)) == data


@named(VECTORS["decodeOnly"])
def test_decode_only_vector(vector):
    assert_decoded(messages.decode_message(hex_bytes(vector["hex"])), vector["value"])


@named(VECTORS["malformedMessages"])
def test_malformed_message_vector(vector):
    with pytest.raises(FormatError):
        messages.decode_message(hex_bytes(vector["hex"]))


@named(VECTORS["methodCalls"])
def test_method_call_vector(vector):
    call = MethodCall(vector["method"], py_value(vector["arguments"]))
    assert methods.encode_method_call(call) == hex_bytes(vector["hex"])
    decoded = methods.decode_method_call(hex_bytes(vector["hex"]))
    assert decoded.method == vector["method"]
    assert_decoded(decoded.arguments, vector["arguments"])


@named(VECTORS["malformedMethodCalls"])
def test_malformed_method_call_vector(vector):
    with pytest.raises(FormatError):
        methods.decode_method_call(hex_bytes(vector["hex"]))


@named(VECTORS["envelopes"])
def test_envelope_vector(vector):
    data = hex_bytes(vector["hex"])
    if "success" in vector:
        if vector["encodes"]:
            assert methods.encode_success_envelope(py_value(vector["success"])) == data
        assert_decoded(methods.decode_envelope(data), vector["success"])
    else:
        error = vector["error"]
        details = py_value(error["details"])
        if vector["encodes"]:
            assert methods.encode_error_envelope(error["code"], error["message"], details, error["stacktrace"]) == data
        with pytest.raises(PlatformException) as raised:
            methods.decode_envelope(data)
        assert (raised.value.code, raised.value.message, raised.value.stacktrace) == (
            error["code"], error["message"], error["stacktrace"])
        assert_decoded(raised.value.details, error["details"])


@named(VECTORS["malformedEnvelopes"])
def test_malformed_envelope_vector(vector):
    with pytest.raises(FormatError):
        methods.decode_envelope(hex_bytes(vector["hex"]))


def test_every_vector_group_is_read():
    """A vector group this suite does not know would go untested: fail instead."""
    known = {"about", "messages", "decodeOnly", "malformedMessages", "methodCalls", "malformedMethodCalls",
             "envelopes", "malformedEnvelopes"}
    assert set(VECTORS) == known
    assert sum(len(v) for k, v in VECTORS.items() if k != "about") == 72


# MARK: Python's own values

def test_ints_are_int32_when_they_fit_else_int64_and_beyond_64_bits_an_error():
    assert messages.encode_message(2**31 - 1)[0] == 3
    assert messages.encode_message(2**31)[0] == 4
    assert messages.encode_message(-(2**63)) == bytes.fromhex("04 0000000000000080")
    with pytest.raises(FormatError):
        messages.encode_message(2**63)
    with pytest.raises(FormatError):
        Int64(2**63)


def test_int64_survives_a_round_trip_as_int64_and_compares_as_an_int():
    data = messages.encode_message(Int64(5))
    assert data == bytes.fromhex("04 0500000000000000")
    decoded = messages.decode_message(data)
    assert decoded == 5 and type(decoded) is Int64 and messages.encode_message(decoded) == data
    assert repr(decoded) == "Int64(5)"


def test_bool_is_not_an_int_and_a_float_is_always_float64():
    assert messages.encode_message([True, 1, 1.0]) == bytes.fromhex("0c 03 01 03 01000000 06 00000000000000 000000000000f03f")


def test_bytes_like_values_and_tuples():
    assert messages.encode_message(bytearray(b"ab")) == messages.encode_message(b"ab") == bytes.fromhex("08 02 6162")
    assert messages.encode_message(memoryview(b"ab")) == bytes.fromhex("08 02 6162")
    assert messages.encode_message((1, "x")) == messages.encode_message([1, "x"])


def test_maps_a_dict_cannot_hold_decode_to_map_entries_that_reencode_to_the_same_bytes():
    for entries in ([([1, 2], "list key")], [(1, "int"), (True, "bool")], [(1, "a"), (1.0, "b")],
                    [("k", 1), ("k", 2)], [({"a": 1}, None)]):
        data = messages.encode_message(MapEntries(entries))
        decoded = messages.decode_message(data)
        assert isinstance(decoded, MapEntries) and decoded == entries
        assert messages.encode_message(decoded) == data


def test_float32_list_nan_payload_is_kept():
    data = bytes.fromhex("0e 01 0000 0100c07f")
    decoded = messages.decode_message(data)
    assert decoded.typecode == "f" and messages.encode_message(decoded) == data


def test_unencodable_values():
    for value in (object(), {1, 2}, array.array("h", [1]), "\ud800"):
        with pytest.raises(FormatError):
            messages.encode_message(value)


def nested(depth):
    value = None
    for _ in range(depth):
        value = [value]
    return value


def test_nesting_deeper_than_1000_levels_is_an_error_both_ways_and_exactly_that_deep_is_fine():
    depth = switchboard.MAX_NESTING_DEPTH
    assert depth == 1000
    deepest = messages.encode_message(nested(depth))  # compared as bytes: == on the lists would recurse
    assert deepest == bytes([12, 1] * depth + [0])
    assert messages.encode_message(messages.decode_message(deepest)) == deepest
    with pytest.raises(FormatError):
        messages.encode_message(nested(depth + 1))
    with pytest.raises(FormatError):
        messages.decode_message(bytes([12, 1] * (depth + 1) + [0]))
    deep_maps = bytes([13, 1, 0] * depth + [0])
    assert messages.encode_message(messages.decode_message(deep_maps)) == deep_maps
    with pytest.raises(FormatError):
        messages.decode_message(bytes([13, 1, 0] * (depth + 1) + [0]))
    json_codec = JSONMessageCodec()
    deepest_json = json_codec.encode_message(nested(depth))
    assert deepest_json == b"[" * depth + b"null" + b"]" * depth
    assert json_codec.encode_message(json_codec.decode_message(deepest_json)) == deepest_json
    with pytest.raises(FormatError):
        json_codec.encode_message(nested(depth + 1))
    with pytest.raises(FormatError):
        json_codec.decode_message(b"[" * (depth + 1) + b"]" * (depth + 1))
    assert json_codec.decode_message(b'{"a":' * depth + b"1" + b"}" * depth) is not None


def test_custom_types_extend_the_codec_as_in_flutter():
    class Point:
        def __init__(self, x, y):
            self.x, self.y = x, y

    class PointCodec(StandardMessageCodec):
        def write_value(self, buffer, value):
            if isinstance(value, Point):
                buffer.put_uint8(128)
                self.write_value(buffer, [value.x, value.y])
            else:
                super().write_value(buffer, value)

        def read_value_of_type(self, type_byte, buffer):
            if type_byte == 128:
                return Point(*self.read_value(buffer))
            return super().read_value_of_type(type_byte, buffer)

    codec = PointCodec()
    data = codec.encode_message({"p": [Point(1, 2)]})
    assert data == bytes.fromhex("0d 01 07 01 70 0c 01 80 0c 02 03 01000000 03 02000000")
    point = codec.decode_message(data)["p"][0]
    assert (point.x, point.y) == (1, 2)
    with pytest.raises(FormatError):
        messages.decode_message(data)


# MARK: JSON, string and binary codecs

def test_json_messages_keep_order_ints_and_null_as_a_null_payload():
    codec = JSONMessageCodec()
    assert codec.encode_message({"b": [1, 2.5, "x"], "a": 2**63 + 1}) == b'{"b":[1,2.5,"x"],"a":9223372036854775809}'
    assert list(codec.decode_message(b' {"b": 1, "a": [true, null, -0.5e1, "\\u263a"]} ')) == ["b", "a"]
    assert codec.decode_message(b'{"a":[true,null,-0.5e1,"\\u263a"]}') == {"a": [True, None, -5.0, "\u263a"]}
    assert codec.encode_message(None) is None and codec.decode_message(None) is None
    assert codec.encode_message(b"\x01\x02") == b"[1,2]"
    for bad in (b"[1,]", b"{1:2}", b'"open', b"[1] 2", b"", b"\xff", b"nul", b'{"a" 1}'):
        with pytest.raises(FormatError):
            codec.decode_message(bad)
    for unencodable in (math.nan, {1: 2}, object()):
        with pytest.raises(FormatError):
            codec.encode_message(unencodable)


def test_json_method_codec_calls_and_envelopes():
    codec = JSONMethodCodec()
    assert codec.encode_method_call(MethodCall("echo", {"x": 1})) == b'{"method":"echo","args":{"x":1}}'
    assert codec.decode_method_call(b'{"method":"m"}') == MethodCall("m", None)
    assert codec.encode_success_envelope([1]) == b"[[1]]"
    assert codec.decode_envelope(b"[[1]]") == [1]
    assert codec.encode_error_envelope("c", "m", 5) == b'["c","m",5]'
    assert codec.encode_error_envelope("c", None, None, "s") == b'["c",null,null,"s"]'
    with pytest.raises(PlatformException) as raised:
        codec.decode_envelope(b'["c","m",{"k":1},"trace"]')
    assert (raised.value.code, raised.value.message, raised.value.details, raised.value.stacktrace) == (
        "c", "m", {"k": 1}, "trace")
    for bad in (b"[]", b'["c","m"]', b'[1,"m",null]', b"{}", None):
        with pytest.raises(FormatError):
            codec.decode_envelope(bad)


def test_string_and_binary_codecs_tell_null_from_empty():
    strings, binary = StringCodec(), BinaryCodec()
    assert strings.encode_message("\u263a") == b"\xe2\x98\xba" and strings.decode_message(b"") == ""
    assert strings.encode_message(None) is None and strings.decode_message(None) is None
    with pytest.raises(FormatError):
        strings.decode_message(b"\xc3\x28")
    assert binary.encode_message(bytearray(b"\x00")) == b"\x00" and binary.decode_message(b"") == b""
    assert binary.encode_message(None) is None and binary.decode_message(None) is None
