// The codecs against the shared byte vectors (protocol/vectors/standard-codec.json), plus round trips.
import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import {
  StandardMessageCodec, StandardMethodCodec, JSONMessageCodec, JSONMethodCodec, StringCodec, BinaryCodec,
  Float64, FormatError, PlatformException, MAX_NESTING_DEPTH,
} from '../codec.js';

const vectors = JSON.parse(readFileSync(new URL('../../../protocol/vectors/standard-codec.json', import.meta.url)));
const messages = new StandardMessageCodec();
const methods = new StandardMethodCodec();

/** Bytes of a vector's hex: pairs of hex digits, spaces ignored, "zeros:N" = N zero bytes. */
function bytes(hex) {
  const out = [];
  for (const token of hex.split(/\s+/).filter(Boolean)) {
    if (token.startsWith('zeros:')) {
      out.push(...new Uint8Array(Number(token.slice(6))));
    } else {
      for (let i = 0; i < token.length; i += 2) out.push(parseInt(token.slice(i, i + 2), 16));
    }
  }
  return Uint8Array.from(out);
}

function doubleOfBits(hex) {
  const view = new DataView(new ArrayBuffer(8));
  view.setBigUint64(0, BigInt(`0x${hex}`));
  return view.getFloat64(0);
}

function bitsOfDouble(x) {
  const view = new DataView(new ArrayBuffer(8));
  view.setFloat64(0, x);
  return view.getBigUint64(0).toString(16).padStart(16, '0');
}

/** The JavaScript value a tagged vector value stands for, as the encoder should be given it. */
function jsValue(tagged) {
  const [[tag, v]] = Object.entries(tagged);
  const zerosOr = (make) => (typeof v === 'string' ? new Uint8Array(Number(v.slice(6))) : make(v));
  switch (tag) {
    case 'null': return null;
    case 'bool': case 'int32': case 'string': return v;
    case 'int64': return BigInt(v);
    case 'float64': return new Float64(v);
    case 'float64Bits': return new Float64(doubleOfBits(v));
    case 'uint8List': return zerosOr((a) => Uint8Array.from(a));
    case 'int32List': return Int32Array.from(v);
    case 'int64List': return BigInt64Array.from(v.map(BigInt));
    case 'float32List': return Float32Array.from(v);
    case 'float64List': return Float64Array.from(v);
    case 'list': return v.map(jsValue);
    case 'map': return new Map(v.map(([k, val]) => [jsValue(k), jsValue(val)]));
    default: throw new Error(`unknown tag ${tag}`);
  }
}

/** Asserts that a decoded value is what the tagged value says, as precisely as JavaScript can tell. */
function assertDecoded(actual, tagged, path = 'value') {
  const [[tag, v]] = Object.entries(tagged);
  const expected = jsValue(tagged);
  switch (tag) {
    case 'null': case 'bool': case 'string': return assert.equal(actual, expected, path);
    case 'int32':
      assert.equal(typeof actual, 'number', path);
      return assert.equal(actual, v, path);
    case 'int64':
      assert.equal(typeof actual, 'bigint', path);
      return assert.equal(actual, expected, path);
    case 'float64': case 'float64Bits':
      assert.equal(typeof actual, 'number', path);
      return assert.equal(bitsOfDouble(actual), bitsOfDouble(expected.value), path);
    case 'list':
      assert.ok(Array.isArray(actual), `${path} is an array`);
      assert.equal(actual.length, v.length, `${path} length`);
      return v.forEach((element, i) => assertDecoded(actual[i], element, `${path}[${i}]`));
    case 'map': {
      assert.ok(actual instanceof Map, `${path} is a Map`);
      const entries = [...actual];
      assert.equal(entries.length, v.length, `${path} size`);
      return v.forEach(([k, val], i) => {
        assertDecoded(entries[i][0], k, `${path} key ${i}`);
        assertDecoded(entries[i][1], val, `${path} value ${i}`);
      });
    }
    default: // typed lists
      assert.equal(actual.constructor, expected.constructor, `${path} type`);
      return assert.deepEqual(actual, expected, path);
  }
}

describe('shared vectors', () => {
  for (const vector of vectors.messages) {
    test(`message: ${vector.name}`, () => {
      assert.deepEqual(messages.encodeMessage(jsValue(vector.value)), bytes(vector.hex), 'encoding');
      assertDecoded(messages.decodeMessage(bytes(vector.hex)), vector.value);
    });
  }
  for (const vector of vectors.decodeOnly) {
    test(`decode only: ${vector.name}`, () => assertDecoded(messages.decodeMessage(bytes(vector.hex)), vector.value));
  }
  for (const vector of vectors.malformedMessages) {
    test(`malformed message: ${vector.name}`, () => {
      assert.throws(() => messages.decodeMessage(bytes(vector.hex)), FormatError);
    });
  }
  for (const vector of vectors.methodCalls) {
    test(`method call: ${vector.name}`, () => {
      const call = { method: vector.method, args: jsValue(vector.arguments) };
      assert.deepEqual(methods.encodeMethodCall(call), bytes(vector.hex), 'encoding');
      const decoded = methods.decodeMethodCall(bytes(vector.hex));
      assert.equal(decoded.method, vector.method);
      assertDecoded(decoded.args, vector.arguments, 'args');
    });
  }
  for (const vector of vectors.malformedMethodCalls ?? []) {
    test(`malformed method call: ${vector.name}`, () => {
      assert.throws(() => methods.decodeMethodCall(bytes(vector.hex)), FormatError);
    });
  }
  for (const vector of vectors.envelopes) {
    test(`envelope: ${vector.name}`, () => {
      const payload = bytes(vector.hex);
      if (vector.success) {
        assertDecoded(methods.decodeEnvelope(payload), vector.success);
        if (vector.encodes) assert.deepEqual(methods.encodeSuccessEnvelope(jsValue(vector.success)), payload);
        return;
      }
      const { code, message, details, stacktrace } = vector.error;
      assert.throws(() => methods.decodeEnvelope(payload), (error) => {
        assert.ok(error instanceof PlatformException, `${error} is a PlatformException`);
        assert.equal(error.code, code);
        assert.equal(error.message, message);
        assertDecoded(error.details, details, 'details');
        assert.equal(error.stacktrace, stacktrace);
        return true;
      });
      if (vector.encodes) {
        assert.deepEqual(methods.encodeErrorEnvelope(code, message, jsValue(details), stacktrace), payload);
      }
    });
  }
  for (const vector of vectors.malformedEnvelopes) {
    test(`malformed envelope: ${vector.name}`, () => {
      assert.throws(() => methods.decodeEnvelope(bytes(vector.hex)), FormatError);
    });
  }
});

/** A small deterministic random generator (mulberry32). */
function random(seed) {
  return () => {
    seed = (seed + 0x6d2b79f5) | 0;
    let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function randomValue(rand, depth = 0) {
  const pick = Math.floor(rand() * (depth > 3 ? 11 : 13));
  const n = Math.floor(rand() * 6);
  const int32 = () => (rand() * 2 ** 32 - 2 ** 31) | 0;
  const int64 = () => BigInt.asIntN(64, BigInt(Math.floor(rand() * 2 ** 32)) << 32n | BigInt(Math.floor(rand() * 2 ** 32)));
  switch (pick) {
    case 0: return null;
    case 1: return rand() < 0.5;
    case 2: return int32();
    case 3: return int64();
    case 4: return new Float64((rand() - 0.5) * 1e6);
    case 5: return Array.from({ length: n }, () => String.fromCodePoint(Math.floor(rand() * 0x10000) % 0xd800 + 1)).join('');
    case 6: return Uint8Array.from({ length: n * 50 }, () => rand() * 256);
    case 7: return Int32Array.from({ length: n }, int32);
    case 8: return BigInt64Array.from({ length: n }, int64);
    case 9: return Float32Array.from({ length: n }, () => rand());
    case 10: return Float64Array.from({ length: n }, () => rand());
    case 11: return Array.from({ length: n }, () => randomValue(rand, depth + 1));
    default: return new Map(Array.from({ length: n }, () => [randomValue(rand, depth + 1), randomValue(rand, depth + 1)]));
  }
}

test('random values re-encode to the same bytes, also inside calls and envelopes', () => {
  const rand = random(42);
  for (let i = 0; i < 500; i++) {
    const value = randomValue(rand);
    // Decoded doubles come back as plain numbers: mark them again before re-encoding.
    const encoded = messages.encodeMessage(value);
    const reencoded = messages.encodeMessage(markDoubles(messages.decodeMessage(encoded), value));
    assert.deepEqual(reencoded, encoded, `value ${i}`);
    const envelope = methods.encodeSuccessEnvelope(value);
    assert.deepEqual(methods.encodeSuccessEnvelope(markDoubles(methods.decodeEnvelope(envelope), value)), envelope);
  }
});

/** `decoded` with every number that was a Float64 in `original` wrapped again. */
function markDoubles(decoded, original) {
  if (original instanceof Float64) return new Float64(decoded);
  if (Array.isArray(original)) return decoded.map((v, i) => markDoubles(v, original[i]));
  if (original instanceof Map) {
    const keys = [...original.keys()];
    const values = [...original.values()];
    return new Map([...decoded].map(([k, v], i) => [markDoubles(k, keys[i]), markDoubles(v, values[i])]));
  }
  return decoded;
}

test('numbers choose int32, int64 or float64 as Flutter web does; plain objects encode as maps', () => {
  const hex = (v) => Buffer.from(messages.encodeMessage(v)).toString('hex');
  assert.equal(hex(5), '0305000000');
  assert.equal(hex(2 ** 31), '040000008000000000');
  assert.equal(hex(5n), '040500000000000000');
  assert.equal(hex(0.5), '0600000000000000000000000000e03f');
  assert.equal(hex(-0), '0600000000000000' + '0000000000000080');
  assert.equal(hex({ a: 1 }), '0d01070161' + '0301000000');
  assert.throws(() => messages.encodeMessage(1n << 63n), FormatError);
  assert.throws(() => messages.encodeMessage(new Date()), FormatError);
});

test('a string keeps a leading byte-order mark', () => {
  assert.equal(messages.decodeMessage(messages.encodeMessage('\ufeffx')), '\ufeffx');
});

test(`nesting deeper than ${MAX_NESTING_DEPTH} levels is an error both ways, and exactly that deep is fine`, () => {
  const nested = (depth) => { let v = null; for (let i = 0; i < depth; i++) v = [v]; return v; };
  assert.ok(messages.decodeMessage(messages.encodeMessage(nested(MAX_NESTING_DEPTH))));
  assert.throws(() => messages.encodeMessage(nested(MAX_NESTING_DEPTH + 1)), FormatError);
  const deep = Uint8Array.from([...new Array(MAX_NESTING_DEPTH + 1).fill([12, 1]).flat(), 0]);
  assert.throws(() => messages.decodeMessage(deep), FormatError);
  const json = new JSONMessageCodec();
  assert.ok(json.decodeMessage(json.encodeMessage(nested(MAX_NESTING_DEPTH))));
  assert.throws(() => json.encodeMessage(nested(MAX_NESTING_DEPTH + 1)), FormatError);
  assert.throws(() => json.decodeMessage(new TextEncoder().encode('['.repeat(MAX_NESTING_DEPTH + 1))), FormatError);
});

describe('JSON codecs', () => {
  const json = new JSONMessageCodec();
  const text = (bytes) => new TextDecoder().decode(bytes);
  const utf8 = (s) => new TextEncoder().encode(s);

  test('messages: Maps in order, bigints with all their digits, null as a null payload', () => {
    assert.equal(json.encodeMessage(null), null);
    assert.equal(json.decodeMessage(null), null);
    const value = json.decodeMessage(utf8(' {"b":1,"1":[true,null,"\\u263a",1.5,12345678901234567890]} '));
    assert.deepEqual([...value.keys()], ['b', '1']);
    assert.deepEqual(value.get('1'), [true, null, '\u263a', 1.5, 12345678901234567890n]);
    assert.equal(text(json.encodeMessage(value)), '{"b":1,"1":[true,null,"☺",1.5,12345678901234567890]}');
    assert.equal(text(json.encodeMessage({ bytes: Uint8Array.of(1, 2) })), '{"bytes":[1,2]}');
  });

  test('malformed JSON and values without a JSON form throw FormatError', () => {
    for (const bad of ['', '{', '[1,]', '{"a" 1}', '"\\x"', '1 2', 'nul', '"a\u0001"', '{1:2}']) {
      assert.throws(() => json.decodeMessage(utf8(bad)), FormatError, bad);
    }
    assert.throws(() => json.decodeMessage(Uint8Array.of(0x22, 0xc3, 0x28, 0x22)), FormatError);
    assert.throws(() => json.encodeMessage(NaN), FormatError);
    assert.throws(() => json.encodeMessage(new Map([[1, 2]])), FormatError);
  });

  test('method codec: calls and envelopes as Flutter lays them out', () => {
    const codec = new JSONMethodCodec();
    assert.equal(text(codec.encodeMethodCall({ method: 'echo', args: [1] })), '{"method":"echo","args":[1]}');
    assert.deepEqual(codec.decodeMethodCall(utf8('{"method":"m"}')), { method: 'm', args: null });
    assert.throws(() => codec.decodeMethodCall(utf8('{"args":1}')), FormatError);
    assert.equal(text(codec.encodeSuccessEnvelope('x')), '["x"]');
    assert.equal(codec.decodeEnvelope(utf8('["x"]')), 'x');
    assert.equal(text(codec.encodeErrorEnvelope('c', null, { n: 1 })), '["c",null,{"n":1}]');
    assert.equal(text(codec.encodeErrorEnvelope('c', 'm', null, 's')), '["c","m",null,"s"]');
    assert.throws(() => codec.decodeEnvelope(utf8('["c","m",5,"s"]')), (e) =>
      e instanceof PlatformException && e.code === 'c' && e.message === 'm' && e.details === 5 && e.stacktrace === 's');
    for (const bad of ['[]', '[1,2]', '[1,"m",null]', '["c",1,null]', '{"a":1}']) {
      assert.throws(() => codec.decodeEnvelope(utf8(bad)), FormatError, bad);
    }
    assert.throws(() => codec.decodeEnvelope(null), FormatError);
  });
});

test('string and binary codecs: null is a null payload, empty stays empty, bad UTF-8 throws', () => {
  const strings = new StringCodec();
  const binary = new BinaryCodec();
  assert.equal(strings.encodeMessage(null), null);
  assert.deepEqual(strings.encodeMessage('☺'), Uint8Array.of(0xe2, 0x98, 0xba));
  assert.equal(strings.decodeMessage(new Uint8Array()), '');
  assert.throws(() => strings.decodeMessage(Uint8Array.of(0xff)), FormatError);
  assert.equal(binary.decodeMessage(null), null);
  assert.deepEqual(binary.decodeMessage(new ArrayBuffer(2)), new Uint8Array(2));
  assert.deepEqual(binary.encodeMessage(Uint8Array.of(7)), Uint8Array.of(7));
});
