// Flutter's platform-channel codecs, byte-exact with Flutter's (and Switchboard's Swift) codecs.
// Plain ES module for browsers and Node: no dependencies, no Node-only APIs.
//
// Values of the standard codec in JavaScript:
//   null/undefined → null (type 0)          boolean → 1/2
//   number: integer in int32 range → int32 (3); other safe integer → int64 (4); anything else
//     (fractions, -0, NaN, ±Infinity, integers beyond 2^53) → float64 (6)
//   new Float64(x) → float64 even when x is integral (decoding gives a plain number back)
//   bigint → int64 (4), always; int64 decodes to a bigint, always
//   string → 7; legacy large int (5) decodes to its string of digits
//   Uint8Array 8, Int32Array 9, BigInt64Array 10, Float64Array 11, Float32Array 14
//   Array → list (12); Map or plain object → map (13); every map decodes to a Map (order, key types kept)

/** Nesting of lists and maps deeper than this is an error, in every codec (as on the server). */
export const MAX_NESTING_DEPTH = 1000;

/** Bytes that cannot be decoded, or a value that cannot be encoded. */
export class FormatError extends Error {
  constructor(message, offset) {
    super(offset === undefined ? message : `${message} (at byte ${offset})`);
    this.name = 'FormatError';
    this.offset = offset;
  }
}

/** An error result of a method call or stream: Flutter's PlatformException. `message` may be null. */
export class PlatformException extends Error {
  constructor(code, message = null, details = null, stacktrace = null) {
    super(message == null ? code : `${code}: ${message}`);
    this.name = 'PlatformException';
    this.code = code;
    this.message = message;
    this.details = details;
    this.stacktrace = stacktrace;
  }

  toString() {
    return `PlatformException(${this.code}, ${this.message})`;
  }
}

/** A method answered "not implemented" (a null reply): Flutter's MissingPluginException. */
export class MissingPluginException extends Error {
  constructor(message) {
    super(message);
    this.name = 'MissingPluginException';
  }
}

/** Marks a number to be written as a float64 even when it is integral: `new Float64(1)`. */
export class Float64 {
  constructor(value) {
    this.value = Number(value);
  }

  valueOf() {
    return this.value;
  }
}

const utf8Encoder = new TextEncoder();
const utf8Decoder = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true });

/** UTF-8 bytes of a string. */
export function utf8Encode(string) {
  return utf8Encoder.encode(string);
}

/** The string of UTF-8 bytes; invalid UTF-8 is a FormatError, never repaired. */
export function utf8Decode(bytes, offset) {
  try {
    return utf8Decoder.decode(bytes);
  } catch {
    throw new FormatError('invalid UTF-8', offset);
  }
}

/** Bytes of an ArrayBuffer or any view, as a Uint8Array over the same memory. */
export function asBytes(data) {
  if (data instanceof Uint8Array) return data;
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  throw new FormatError(`expected bytes, got ${describe(data)}`);
}

function describe(value) {
  if (value === null) return 'null';
  if (typeof value !== 'object') return typeof value;
  return value.constructor?.name ?? 'object';
}

function isPlainObject(value) {
  const proto = Object.getPrototypeOf(value);
  return proto === Object.prototype || proto === null;
}

// MARK: Buffers

/** A growable little-endian byte buffer: Flutter's WriteBuffer. Alignment counts from its first byte. */
export class WriteBuffer {
  constructor(capacity = 64) {
    this.bytes = new Uint8Array(capacity);
    this.view = new DataView(this.bytes.buffer);
    this.length = 0;
    this.depth = 0;
  }

  /** Makes room for `n` more bytes and returns the offset where they go. */
  reserve(n) {
    const at = this.length;
    if (at + n > this.bytes.length) {
      const grown = new Uint8Array(Math.max(this.bytes.length * 2, at + n));
      grown.set(this.bytes.subarray(0, at));
      this.bytes = grown;
      this.view = new DataView(grown.buffer);
    }
    this.length += n;
    return at;
  }

  putUint8(v) { const at = this.reserve(1); this.view.setUint8(at, v); }
  putUint16(v) { const at = this.reserve(2); this.view.setUint16(at, v, true); }
  putUint32(v) { const at = this.reserve(4); this.view.setUint32(at, v, true); }
  putInt32(v) { const at = this.reserve(4); this.view.setInt32(at, v, true); }
  putInt64(v) { const at = this.reserve(8); this.view.setBigInt64(at, v, true); }
  putFloat32(v) { const at = this.reserve(4); this.view.setFloat32(at, v, true); }
  putFloat64(v) { this.alignTo(8); this.putAlignedFloat64(v); }
  putAlignedFloat64(v) { const at = this.reserve(8); this.view.setFloat64(at, v, true); }
  putUint8List(bytes) { const at = this.reserve(bytes.length); this.bytes.set(bytes, at); }
  putInt32List(list) { this.alignTo(4); for (const v of list) this.putInt32(v); }
  putInt64List(list) { this.alignTo(8); for (const v of list) this.putInt64(v); }
  putFloat32List(list) { this.alignTo(4); for (const v of list) this.putFloat32(v); }
  putFloat64List(list) { this.alignTo(8); for (const v of list) this.putAlignedFloat64(v); }

  /** Zero bytes up to a multiple of `alignment` from the start. */
  alignTo(alignment) {
    const remainder = this.length % alignment;
    if (remainder !== 0) this.reserve(alignment - remainder);
  }

  /** Enters one level of list or map nesting. */
  enter() {
    if (++this.depth > MAX_NESTING_DEPTH) throw new FormatError(`nesting deeper than ${MAX_NESTING_DEPTH} levels`);
  }

  leave() { this.depth -= 1; }

  /** The bytes written (a copy of exactly that length). */
  done() { return this.bytes.slice(0, this.length); }
}

/** Reads little-endian values with a bounds check before every read: Flutter's ReadBuffer. */
export class ReadBuffer {
  constructor(bytes) {
    this.bytes = asBytes(bytes);
    this.view = new DataView(this.bytes.buffer, this.bytes.byteOffset, this.bytes.byteLength);
    this.position = 0;
    this.depth = 0;
  }

  get remaining() { return this.bytes.length - this.position; }
  get hasRemaining() { return this.remaining > 0; }

  /** Advances past `n` bytes and returns where they start. */
  take(n) {
    if (n > this.remaining) throw new FormatError(`needs ${n} bytes, ${this.remaining} remain`, this.position);
    const at = this.position;
    this.position += n;
    return at;
  }

  getUint8() { return this.view.getUint8(this.take(1)); }
  getUint16() { return this.view.getUint16(this.take(2), true); }
  getUint32() { return this.view.getUint32(this.take(4), true); }
  getInt32() { return this.view.getInt32(this.take(4), true); }
  getInt64() { return this.view.getBigInt64(this.take(8), true); }
  getFloat64() { this.alignTo(8); return this.view.getFloat64(this.take(8), true); }

  /** A copy of the next `n` bytes. */
  getUint8List(n) { const at = this.take(n); return this.bytes.slice(at, at + n); }
  getInt32List(n) { return this.typedList(n, 4, Int32Array, (at) => this.view.getInt32(at, true)); }
  getInt64List(n) { return this.typedList(n, 8, BigInt64Array, (at) => this.view.getBigInt64(at, true)); }
  getFloat32List(n) { return this.typedList(n, 4, Float32Array, (at) => this.view.getFloat32(at, true)); }
  getFloat64List(n) { return this.typedList(n, 8, Float64Array, (at) => this.view.getFloat64(at, true)); }

  /** Aligns, checks that `n` elements of `width` bytes remain (before allocating), reads them. */
  typedList(n, width, ArrayType, read) {
    this.alignTo(width);
    if (n > this.remaining / width) {
      throw new FormatError(`${n} elements of ${width} bytes exceed the ${this.remaining} bytes left`, this.position);
    }
    const out = new ArrayType(n);
    const start = this.take(n * width);
    for (let i = 0; i < n; i++) out[i] = read(start + i * width);
    return out;
  }

  /** Skips padding up to a multiple of `alignment` from the start. */
  alignTo(alignment) {
    const remainder = this.position % alignment;
    if (remainder !== 0) this.take(alignment - remainder);
  }

  enter() {
    if (++this.depth > MAX_NESTING_DEPTH) {
      throw new FormatError(`nesting deeper than ${MAX_NESTING_DEPTH} levels`, this.position);
    }
  }

  leave() { this.depth -= 1; }

  /** Throws unless every byte has been read. */
  expectEnd(what) {
    if (this.hasRemaining) throw new FormatError(`${this.remaining} bytes left over after the ${what}`, this.position);
  }
}

// MARK: Standard codecs

const T = {
  null: 0, true: 1, false: 2, int32: 3, int64: 4, largeInt: 5, float64: 6, string: 7, uint8List: 8,
  int32List: 9, int64List: 10, float64List: 11, list: 12, map: 13, float32List: 14,
};
/** Typed arrays the standard codec carries: array type, type byte, WriteBuffer method. */
const TYPED_LISTS = [
  [Uint8Array, T.uint8List, 'putUint8List'], [Int32Array, T.int32List, 'putInt32List'],
  [BigInt64Array, T.int64List, 'putInt64List'], [Float64Array, T.float64List, 'putFloat64List'],
  [Float32Array, T.float32List, 'putFloat32List'],
];
const INT64_MIN = -(1n << 63n);
const INT64_MAX = (1n << 63n) - 1n;

/**
 * Flutter's StandardMessageCodec. Extend it like Flutter's: override `writeValue` (for custom values,
 * write a type byte >= 128 and the body, else call super) and `readValueOfType` (likewise).
 */
export class StandardMessageCodec {
  /** The value's bytes; null is the single byte 00 (never a null payload). */
  encodeMessage(message) {
    const buffer = new WriteBuffer();
    this.writeValue(buffer, message);
    return buffer.done();
  }

  /** One value; a null or empty payload is null; bytes left over are an error. */
  decodeMessage(bytes) {
    if (bytes == null || bytes.byteLength === 0) return null;
    const buffer = new ReadBuffer(bytes);
    const value = this.readValue(buffer);
    buffer.expectEnd('value');
    return value;
  }

  /** Writes a type byte and the value's body. */
  writeValue(buffer, value) {
    if (value == null) return buffer.putUint8(T.null);
    switch (typeof value) {
      case 'boolean': return buffer.putUint8(value ? T.true : T.false);
      case 'number': return this.writeNumber(buffer, value);
      case 'bigint':
        if (value < INT64_MIN || value > INT64_MAX) throw new FormatError(`${value} does not fit in 64 bits`);
        buffer.putUint8(T.int64);
        return buffer.putInt64(value);
      case 'string': {
        const bytes = utf8Encode(value);
        buffer.putUint8(T.string);
        this.writeSize(buffer, bytes.length);
        return buffer.putUint8List(bytes);
      }
    }
    if (value instanceof Float64) {
      buffer.putUint8(T.float64);
      return buffer.putFloat64(value.value);
    }
    const typed = TYPED_LISTS.find(([ArrayType]) => value instanceof ArrayType);
    if (typed) {
      buffer.putUint8(typed[1]);
      this.writeSize(buffer, value.length);
      return buffer[typed[2]](value);
    }
    if (Array.isArray(value)) {
      buffer.enter();
      buffer.putUint8(T.list);
      this.writeSize(buffer, value.length);
      for (const element of value) this.writeValue(buffer, element);
      return buffer.leave();
    }
    if (value instanceof Map || isPlainObject(value)) {
      const entries = value instanceof Map ? [...value] : Object.entries(value);
      buffer.enter();
      buffer.putUint8(T.map);
      this.writeSize(buffer, entries.length);
      for (const [k, v] of entries) {
        this.writeValue(buffer, k);
        this.writeValue(buffer, v);
      }
      return buffer.leave();
    }
    throw new FormatError(`the standard codec cannot encode ${describe(value)}`);
  }

  writeNumber(buffer, value) {
    if (Number.isInteger(value) && !Object.is(value, -0)) {
      if (value >= -0x80000000 && value <= 0x7fffffff) {
        buffer.putUint8(T.int32);
        return buffer.putInt32(value);
      }
      if (Number.isSafeInteger(value)) {
        buffer.putUint8(T.int64);
        return buffer.putInt64(BigInt(value));
      }
    }
    buffer.putUint8(T.float64);
    buffer.putFloat64(value);
  }

  /** Reads a type byte and the value it announces. */
  readValue(buffer) {
    return this.readValueOfType(buffer.getUint8(), buffer);
  }

  /** Reads the body of a value of `type` (the type byte is already read). */
  readValueOfType(type, buffer) {
    switch (type) {
      case T.null: return null;
      case T.true: return true;
      case T.false: return false;
      case T.int32: return buffer.getInt32();
      case T.int64: return buffer.getInt64();
      case T.float64: return buffer.getFloat64();
      case T.largeInt:
      case T.string: {
        const start = buffer.position;
        return utf8Decode(buffer.getUint8List(this.readSize(buffer)), start);
      }
      case T.uint8List: return buffer.getUint8List(this.readSize(buffer));
      case T.int32List: return buffer.getInt32List(this.readSize(buffer));
      case T.int64List: return buffer.getInt64List(this.readSize(buffer));
      case T.float32List: return buffer.getFloat32List(this.readSize(buffer));
      case T.float64List: return buffer.getFloat64List(this.readSize(buffer));
      case T.list: {
        const count = this.readCount(buffer, 1);
        buffer.enter();
        const list = new Array(count);
        for (let i = 0; i < count; i++) list[i] = this.readValue(buffer);
        buffer.leave();
        return list;
      }
      case T.map: {
        const count = this.readCount(buffer, 2);
        buffer.enter();
        const map = new Map();
        for (let i = 0; i < count; i++) {
          const key = this.readValue(buffer);
          map.set(key, this.readValue(buffer));
        }
        buffer.leave();
        return map;
      }
      default: throw new FormatError(`unknown type byte ${type}`, buffer.position - 1);
    }
  }

  /** Writes a size: one byte below 254, else 254 + u16 or 255 + u32. */
  writeSize(buffer, size) {
    if (size < 254) {
      buffer.putUint8(size);
    } else if (size <= 0xffff) {
      buffer.putUint8(254);
      buffer.putUint16(size);
    } else if (size <= 0xffffffff) {
      buffer.putUint8(255);
      buffer.putUint32(size);
    } else {
      throw new FormatError(`size ${size} does not fit in 32 bits`);
    }
  }

  /** Reads a size (1, 3 or 5 bytes). */
  readSize(buffer) {
    const first = buffer.getUint8();
    if (first < 254) return first;
    return first === 254 ? buffer.getUint16() : buffer.getUint32();
  }

  /** Reads a count of elements taking at least `width` bytes each, refusing counts the payload cannot hold. */
  readCount(buffer, width) {
    const count = this.readSize(buffer);
    if (count > buffer.remaining / width) {
      throw new FormatError(`${count} elements exceed the ${buffer.remaining} bytes left`, buffer.position);
    }
    return count;
  }
}

/** Flutter's StandardMethodCodec: calls are name + arguments; envelopes start with 0 (success) or 1 (error). */
export class StandardMethodCodec {
  constructor(messageCodec = new StandardMessageCodec()) {
    this.messageCodec = messageCodec;
  }

  /** Encodes `{method, args}`. */
  encodeMethodCall({ method, args = null }) {
    if (typeof method !== 'string') throw new FormatError('the method name must be a string');
    const buffer = new WriteBuffer();
    this.messageCodec.writeValue(buffer, method);
    this.messageCodec.writeValue(buffer, args);
    return buffer.done();
  }

  /** Decodes a call into `{method, args}`. */
  decodeMethodCall(bytes) {
    const buffer = this.reader(bytes, 'method call');
    const method = this.messageCodec.readValue(buffer);
    if (typeof method !== 'string') throw new FormatError('the method name is not a string', 0);
    const args = this.messageCodec.readValue(buffer);
    buffer.expectEnd('method call');
    return { method, args };
  }

  encodeSuccessEnvelope(result) {
    const buffer = new WriteBuffer();
    buffer.putUint8(0);
    this.messageCodec.writeValue(buffer, result);
    return buffer.done();
  }

  /** An error envelope: 4 fields only when a stack trace is given. */
  encodeErrorEnvelope(code, message = null, details = null, stacktrace = null) {
    const buffer = new WriteBuffer();
    buffer.putUint8(1);
    this.messageCodec.writeValue(buffer, code);
    this.messageCodec.writeValue(buffer, message);
    this.messageCodec.writeValue(buffer, details);
    if (stacktrace != null) this.messageCodec.writeValue(buffer, stacktrace);
    return buffer.done();
  }

  /** The result of a success envelope; an error envelope throws its PlatformException. */
  decodeEnvelope(bytes) {
    const buffer = this.reader(bytes, 'envelope');
    const kind = buffer.getUint8();
    if (kind === 0) {
      const value = this.messageCodec.readValue(buffer);
      buffer.expectEnd('envelope');
      return value;
    }
    if (kind !== 1) throw new FormatError(`an envelope starts with 0 or 1, not ${kind}`, 0);
    const code = this.messageCodec.readValue(buffer);
    if (typeof code !== 'string') throw new FormatError('the error code is not a string', buffer.position);
    const message = this.optionalString(buffer, 'message');
    const details = this.messageCodec.readValue(buffer);
    const stacktrace = buffer.hasRemaining ? this.optionalString(buffer, 'stack trace') : null;
    buffer.expectEnd('envelope');
    throw new PlatformException(code, message, details, stacktrace);
  }

  optionalString(buffer, what) {
    const value = this.messageCodec.readValue(buffer);
    if (value !== null && typeof value !== 'string') {
      throw new FormatError(`the error ${what} is not a string or null`, buffer.position);
    }
    return value;
  }

  reader(bytes, what) {
    if (bytes == null) throw new FormatError(`a null payload where a ${what} was expected`);
    return new ReadBuffer(bytes);
  }
}

// MARK: String and binary

/** Flutter's StringCodec: UTF-8 text; null is a null payload. */
export class StringCodec {
  encodeMessage(message) { return message == null ? null : utf8Encode(message); }
  decodeMessage(bytes) { return bytes == null ? null : utf8Decode(asBytes(bytes)); }
}

/** Flutter's BinaryCodec: the payload is the message (a Uint8Array); null is a null payload. */
export class BinaryCodec {
  encodeMessage(message) { return message == null ? null : asBytes(message); }
  decodeMessage(bytes) { return bytes == null ? null : asBytes(bytes); }
}

// MARK: JSON codecs

/** Flutter's JSONMessageCodec: UTF-8 JSON; null is a null payload. Objects decode to Maps. */
export class JSONMessageCodec {
  encodeMessage(message) { return message == null ? null : utf8Encode(toJSON(message)); }
  decodeMessage(bytes) { return bytes == null ? null : parseJSON(asBytes(bytes)); }
}

/** Flutter's JSONMethodCodec: calls `{"method":..,"args":..}`, envelopes `[result]` or `[code, message, details(, stacktrace)]`. */
export class JSONMethodCodec {
  encodeMethodCall({ method, args = null }) {
    if (typeof method !== 'string') throw new FormatError('the method name must be a string');
    return utf8Encode(toJSON(new Map([['method', method], ['args', args]])));
  }

  decodeMethodCall(bytes) {
    const call = this.parse(bytes, 'method call');
    if (!(call instanceof Map) || typeof call.get('method') !== 'string') throw new FormatError('invalid method call');
    return { method: call.get('method'), args: call.get('args') ?? null };
  }

  encodeSuccessEnvelope(result) {
    return utf8Encode(toJSON([result]));
  }

  encodeErrorEnvelope(code, message = null, details = null, stacktrace = null) {
    const fields = [code, message, details];
    if (stacktrace != null) fields.push(stacktrace);
    return utf8Encode(toJSON(fields));
  }

  decodeEnvelope(bytes) {
    const fields = this.parse(bytes, 'envelope');
    if (!Array.isArray(fields)) throw new FormatError('an envelope is a JSON array');
    if (fields.length === 1) return fields[0];
    const [code, message, details, stacktrace = null] = fields;
    const optional = (v) => v === null || typeof v === 'string';
    if ((fields.length !== 3 && fields.length !== 4) || typeof code !== 'string' || !optional(message) || !optional(stacktrace)) {
      throw new FormatError('invalid envelope');
    }
    throw new PlatformException(code, message, details, stacktrace);
  }

  parse(bytes, what) {
    if (bytes == null) throw new FormatError(`a null payload where a ${what} was expected`);
    return parseJSON(asBytes(bytes));
  }
}

/** Compact JSON text of a value; Maps need string keys; bigints keep all their digits; typed lists become arrays. */
export function toJSON(value, depth = 0) {
  if (value == null) return 'null';
  switch (typeof value) {
    case 'boolean': return String(value);
    case 'bigint': return value.toString();
    case 'string': return JSON.stringify(value);
    case 'number':
      if (!Number.isFinite(value)) throw new FormatError(`${value} has no JSON form`);
      return JSON.stringify(value);
  }
  if (value instanceof Float64) return toJSON(value.value);
  if (ArrayBuffer.isView(value) && !(value instanceof DataView)) return toJSON(Array.from(value), depth);
  if (depth >= MAX_NESTING_DEPTH) throw new FormatError(`nesting deeper than ${MAX_NESTING_DEPTH} levels`);
  if (Array.isArray(value)) return `[${value.map((v) => toJSON(v, depth + 1)).join(',')}]`;
  if (value instanceof Map || isPlainObject(value)) {
    const entries = value instanceof Map ? [...value] : Object.entries(value);
    return `{${entries.map(([k, v]) => {
      if (typeof k !== 'string') throw new FormatError('JSON map keys must be strings');
      return `${JSON.stringify(k)}:${toJSON(v, depth + 1)}`;
    }).join(',')}}`;
  }
  throw new FormatError(`JSON cannot encode ${describe(value)}`);
}

/**
 * Parses UTF-8 JSON. Objects become Maps (entry order kept); integers beyond 2^53 become bigints;
 * nesting deeper than MAX_NESTING_DEPTH and anything after the value are errors.
 */
export function parseJSON(bytes) {
  const text = utf8Decode(bytes);
  let i = 0;
  const fail = (what) => { throw new FormatError(`invalid JSON: ${what}`, i); };
  const skipSpace = () => { while (i < text.length && ' \t\n\r'.includes(text[i])) i++; };
  const NUMBER = /-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?/y;

  function value(depth) {
    skipSpace();
    const c = text[i];
    if (c === '{' || c === '[') {
      if (depth >= MAX_NESTING_DEPTH) fail(`nesting deeper than ${MAX_NESTING_DEPTH} levels`);
      return c === '{' ? object(depth + 1) : array(depth + 1);
    }
    if (c === '"') return string();
    for (const [word, result] of [['true', true], ['false', false], ['null', null]]) {
      if (text.startsWith(word, i)) {
        i += word.length;
        return result;
      }
    }
    NUMBER.lastIndex = i;
    const match = NUMBER.exec(text);
    if (!match) fail('unexpected character');
    i = NUMBER.lastIndex;
    const n = Number(match[0]);
    return match[1] || match[2] || Number.isSafeInteger(n) ? n : BigInt(match[0]);
  }

  /** Finds the closing quote, then lets JSON.parse check and unescape the literal. */
  function string() {
    let end = i + 1;
    while (end < text.length && text[end] !== '"') end += text[end] === '\\' ? 2 : 1;
    if (end >= text.length) fail('unterminated string');
    let s;
    try { s = JSON.parse(text.slice(i, end + 1)); } catch { fail('bad string'); }
    i = end + 1;
    return s;
  }

  function array(depth) {
    const out = [];
    i++;
    skipSpace();
    if (text[i] === ']') { i++; return out; }
    for (;;) {
      out.push(value(depth));
      skipSpace();
      const c = text[i++];
      if (c === ']') return out;
      if (c !== ',') fail("expected ',' or ']'");
    }
  }

  function object(depth) {
    const out = new Map();
    i++;
    skipSpace();
    if (text[i] === '}') { i++; return out; }
    for (;;) {
      skipSpace();
      if (text[i] !== '"') fail('expected a string key');
      const key = string();
      skipSpace();
      if (text[i++] !== ':') fail("expected ':'");
      out.set(key, value(depth));
      skipSpace();
      const c = text[i++];
      if (c === '}') return out;
      if (c !== ',') fail("expected ',' or '}'");
    }
  }

  const result = value(0);
  skipSpace();
  if (i !== text.length) fail('data after the value');
  return result;
}
