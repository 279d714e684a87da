// Switchboard client for browsers and Node 20+ (with --experimental-websocket): Flutter's platform
// channels spoken over wire-v1 binary frames inside a WebSocket. Plain ES module, no dependencies.
import { StandardMessageCodec, StandardMethodCodec, JSONMessageCodec, JSONMethodCodec, StringCodec, BinaryCodec, Float64, FormatError, PlatformException, MissingPluginException, MAX_NESTING_DEPTH, WriteBuffer, ReadBuffer, utf8Encode, utf8Decode, parseJSON, toJSON, asBytes } from './codec.js';

export {
  StandardMessageCodec, StandardMethodCodec, JSONMessageCodec, JSONMethodCodec, StringCodec, BinaryCodec, Float64,
  FormatError, PlatformException, MissingPluginException, MAX_NESTING_DEPTH, WriteBuffer, ReadBuffer, parseJSON, toJSON,
};

/** Frame types of wire-v1 (section 2). */
export const FrameType = Object.freeze({
  HELLO: 0x01, WELCOME: 0x02, MESSAGE: 0x03, REPLY: 0x04, PING: 0x05, PONG: 0x06, ERROR: 0x07, GOAWAY: 0x08,
  REGISTER: 0x09, UNREGISTER: 0x0a, CANCEL: 0x0b, DEMAND: 0x0c,
  /** The session extension (protocol/resumption.md): acknowledgements, and the end of a session. */
  POSITION: 0x0d, END: 0x0e,
});
const NULL_PAYLOAD = 0x01;
/** How long a connection given up with its resuming HELLO unanswered may explain a `session_taken` (resumption.md). */
const LATE_HELLO_WINDOW_MS = 10_000;
const HEADER_SIZE = 12;
const MAX_ID = 0xffffffff;

/** One frame's bytes: `{type, id, channel, payload}` (payload: any bytes); a null payload sets NULL_PAYLOAD. */
export function encodeFrame({ type, id = 0, channel = '', payload = null }) {
  const name = utf8Encode(channel);
  if (name.length > 0xffff) throw new FormatError(`a channel name of ${name.length} bytes is over 65535`);
  if (payload) payload = asBytes(payload);
  const size = payload ? payload.byteLength : 0;
  const bytes = new Uint8Array(HEADER_SIZE + name.length + size);
  const view = new DataView(bytes.buffer);
  view.setUint32(0, bytes.length - 4);
  view.setUint8(4, type);
  view.setUint8(5, payload ? 0 : NULL_PAYLOAD);
  view.setUint16(6, name.length);
  view.setUint32(8, id);
  bytes.set(name, HEADER_SIZE);
  if (payload) bytes.set(payload, HEADER_SIZE + name.length);
  return bytes;
}

/** The frame in one WebSocket message: `{type, flags, id, channel, payload}` (payload null for NULL_PAYLOAD). */
export function decodeFrame(data) {
  const bytes = new Uint8Array(data);
  if (bytes.length < HEADER_SIZE) throw new FormatError(`a frame of ${bytes.length} bytes is shorter than its header`);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const length = view.getUint32(0);
  const flags = view.getUint8(5);
  const chanlen = view.getUint16(6);
  if (length !== bytes.length - 4) throw new FormatError(`the length field says ${length}, the message holds ${bytes.length - 4}`);
  if (chanlen > length - 8) throw new FormatError(`a channel of ${chanlen} bytes does not fit in the frame`);
  const payload = bytes.subarray(HEADER_SIZE + chanlen);
  if (flags & ~NULL_PAYLOAD) throw new FormatError(`reserved flag bits ${flags}`);
  if (flags & NULL_PAYLOAD && payload.length > 0) throw new FormatError('NULL_PAYLOAD with a payload');
  return {
    type: view.getUint8(4),
    flags,
    id: view.getUint32(8),
    channel: utf8Decode(bytes.subarray(HEADER_SIZE, HEADER_SIZE + chanlen)),
    payload: flags & NULL_PAYLOAD ? null : payload,
  };
}

/** Internal hooks shared by the classes of this module (symbols keep them off the public API). */
const STREAMS = Symbol('streams');
const LISTEN = Symbol('listen');
const DELIVER = Symbol('deliver');
/** A request option: called as its answer frame is read, before the promise's callbacks run. */
const ANSWERED = Symbol('answered');
/** A request option: the client makes this request again itself on a new session (a stream's listen, a REGISTER). */
const REDONE = Symbol('redone');
const DISCONNECTED = Symbol('disconnected');
/** Whether frames may be written now or held for the session's next connection. */
const WRITABLE = Symbol('writable');

const DEFAULT_RECONNECT = { initialDelayMs: 100, maxDelayMs: 5000 };
/** What a session keeps of its own stream, sent and not yet acknowledged, before it holds new frames back. */
const DEFAULT_MAX_UNACKNOWLEDGED = 1024 * 1024;
/** ERROR codes after which the server closes: such an ERROR is not in the session's stream (resumption.md). */
const CLOSING_ERRORS = new Set([
  'malformed_frame', 'frame_too_large', 'unauthorized', 'bad_hello', 'unsupported_version', 'slow_consumer', 'timeout',
  'session_taken',
]);
/** Frame types that are requests: each gets one answer (REPLY or ERROR) with its id. */
const REQUEST_TYPES = new Set([FrameType.MESSAGE, FrameType.REGISTER, FrameType.UNREGISTER]);

/**
 * One connection to a Switchboard server, reconnecting if asked to, and resuming its session across lost
 * connections if asked to (protocol/resumption.md). Events (`on`): `state` with
 * 'connected' | 'reconnecting' | 'closed'; `goaway` with the server's reason; `error` with a
 * PlatformException for a server ERROR frame that answers no request (and for a channel that could not
 * be registered again); with `session`: `resumed`, `restarted` and `ended` (see the README).
 *
 * Requests fail with PlatformException codes of their own besides the server's: `disconnected` (the
 * connection dropped while the request was in flight, or it was made while reconnecting), `closed`
 * (the client was closed), `connection_failed` (connect could not reach the server),
 * `frame_too_large` (refused locally: larger than the server's maxFrame), `session_lost` (written on a
 * session that could not be resumed: the server may have run it).
 */
export class SwitchboardClient {
  /** The WELCOME payload: `{version, server, maxFrame, heartbeatMs, session?}`. */
  welcome = null;
  /** 'connecting' | 'connected' | 'reconnecting' | 'closed'. */
  state = 'connecting';
  /** True after a GOAWAY, until the next connection. */
  goingAway = false;
  /** Active event streams by channel name (one per channel, as on the server). */
  [STREAMS] = new Map();

  #url;
  #name;
  #token;
  #reconnect;
  #WebSocket;
  #ws = null;
  #pending = new Map();
  #lastId = 0;
  #handlers = new Map();
  #sleep = null;
  /** Channels this client holds: name → `{handler, payload}` (the REGISTER payload). */
  #registrations = new Map();
  /** Bumped when a session is lost: answers to requests forwarded on the old one are not sent. */
  #epoch = 0;
  /** Whether to ask for a session, and the bound on what it keeps unacknowledged. */
  #sessionOptions;
  /** The session this client has (see #makeSession), or null. */
  #session = null;
  /** Frames of the session's stream not yet written: the connection is away or the kept bytes are at the bound. */
  #held = [];
  /** After a session was lost: `{reason, streams, channels, failed}`, reported once a new connection is up. */
  #restart = null;
  /** The id of the HELLO awaiting its answer on the current connection, and whether it resumes. */
  #hello = null;
  /** The server took the session away (session_taken) on the current connection. */
  #taken = false;
  /**
   * When each connection that ended with a resuming HELLO unanswered stops explaining a `session_taken`
   * (ms, `Date.now()`): such a HELLO may still reach the server and take the session from a later
   * connection, whose `session_taken` is then this client's own doing, but not for ever.
   */
  #unansweredResumes = [];

  /**
   * Connects (HELLO, then WELCOME) and resolves with the client; rejects with a PlatformException
   * (`connection_failed`, or the server's refusal such as `unauthorized`).
   * Options: `name` (sent in HELLO), `token`, `reconnect` (true or `{initialDelayMs, maxDelayMs}`;
   * off by default), `session` (true or `{maxUnacknowledgedBytes}`: ask for a resumable session, which
   * implies `reconnect`), `WebSocket` (an implementation; default: the global one; `TcpSocket` of
   * tcp.js speaks plain TCP in Node). Without a WebSocket (Node 20 without --experimental-websocket) it
   * rejects with a TypeError that says so.
   */
  static async connect(url, options = {}) {
    const client = new SwitchboardClient(url, options);
    try {
      await client.#open();
    } catch (error) {
      client.#setState('closed');
      throw error;
    }
    return client;
  }

  /** Throws a TypeError naming the fix when there is no WebSocket to use (Node 20 without its flag). */
  constructor(url, { name = 'switchboard-js', token, reconnect = false, session = false, WebSocket = globalThis.WebSocket } = {}) {
    if (typeof WebSocket !== 'function') {
      throw new TypeError('this JavaScript runtime has no WebSocket: run Node 20 with --experimental-websocket, '
        + 'or use Node 22 or later (WebSocket is on by default), or pass an implementation as options.WebSocket');
    }
    this.#url = url;
    this.#name = name;
    this.#token = token;
    if (session && reconnect === false) reconnect = true;
    this.#reconnect = reconnect === true ? DEFAULT_RECONNECT : reconnect ? { ...DEFAULT_RECONNECT, ...reconnect } : null;
    this.#WebSocket = WebSocket;
    const maxUnacknowledgedBytes = session?.maxUnacknowledgedBytes ?? DEFAULT_MAX_UNACKNOWLEDGED;
    if (!(Number.isSafeInteger(maxUnacknowledgedBytes) && maxUnacknowledgedBytes > 0)) {
      throw new RangeError('maxUnacknowledgedBytes must be a positive integer');
    }
    this.#sessionOptions = session ? { maxUnacknowledgedBytes } : null;
  }

  /**
   * The session in use, or null: `{token, ttlMs, ackBytes, ackMs}`, the positions `received` and `sent`
   * (bytes of each stream), `unacknowledged` (bytes written and kept until the server acknowledges them)
   * and `held` (frames not written yet). The token is a bearer secret: whoever has it, with this
   * client's identity, can take the session over.
   */
  get session() {
    const s = this.#session;
    return s && {
      token: s.token, ttlMs: s.ttlMs, ackBytes: s.ackBytes, ackMs: s.ackMs, received: s.received, sent: s.sent,
      unacknowledged: s.keptBytes, held: this.#held.length,
    };
  }

  /** Calls `handler` for each `event`; returns a function that stops it. */
  on(event, handler) {
    if (!this.#handlers.has(event)) this.#handlers.set(event, new Set());
    this.#handlers.get(event).add(handler);
    return () => this.off(event, handler);
  }

  off(event, handler) {
    this.#handlers.get(event)?.delete(handler);
  }

  #emit(event, value) {
    for (const handler of this.#handlers.get(event) ?? []) {
      try {
        handler(value);
      } catch (error) {
        queueMicrotask(() => { throw error; });
      }
    }
  }

  #setState(state) {
    if (this.state === state) return;
    this.state = state;
    this.#emit('state', state);
  }

  /** Connected, or reconnecting with a session (or after losing one): frames wait for the next connection. */
  get [WRITABLE]() {
    return this.state === 'connected' || (this.state === 'reconnecting' && (this.#session !== null || this.#restart !== null));
  }

  /**
   * Sends a MESSAGE and resolves with its REPLY payload (a Uint8Array, or null for a null reply).
   * An ERROR answer rejects with its PlatformException; `signal` aborting or `timeoutMs` passing sends
   * CANCEL and rejects with the signal's reason (an AbortError) or a TimeoutError. With a session, a
   * request made while reconnecting waits for the connection.
   */
  request(channel, payload, options = {}) {
    return this.#request({ type: FrameType.MESSAGE, channel, payload }, options);
  }

  #request(frame, { signal, timeoutMs, [ANSWERED]: answered, [REDONE]: redone = false } = {}) {
    return new Promise((resolve, reject) => {
      if (signal?.aborted) return reject(signal.reason);
      if (!this[WRITABLE]) return reject(this.#unavailable());
      const id = this.#nextId();
      const bytes = encodeFrame({ ...frame, id });
      const tooLarge = this.#checkSize(bytes);
      if (tooLarge) return reject(tooLarge);
      let timer;
      const abort = () => this.#abandon(id, signal.reason);
      const settle = (finish) => (value) => {
        clearTimeout(timer);
        signal?.removeEventListener('abort', abort);
        finish(value);
      };
      this.#pending.set(id, { resolve: settle(resolve), reject: settle(reject), answered, redone, channel: frame.channel, type: frame.type });
      signal?.addEventListener('abort', abort, { once: true });
      if (timeoutMs != null) {
        timer = setTimeout(() => this.#abandon(id, new DOMException(`no answer within ${timeoutMs} ms`, 'TimeoutError')), timeoutMs);
      }
      this.#write(bytes);
    });
  }

  /** Grants `n` more events of credit on an event channel (DEMAND; 0xFFFFFFFF = unbounded). */
  demand(channel, n) {
    if (!this[WRITABLE]) return;
    const payload = new Uint8Array(4);
    new DataView(payload.buffer).setUint32(0, n);
    this.#send({ type: FrameType.DEMAND, channel, payload });
  }

  /**
   * Holds `channel` (REGISTER, wire-v1 section 6): each request for it from another client calls
   * `handler(payload)`, whose result (bytes or null; a promise of them) is the REPLY. `kind` and
   * `codec` (`{kind: 'method'|'message', codec: 'standard'|'json'|'string'|'binary'}`) let text clients
   * call it too. Resolves once the server has granted it; rejects with its ERROR (`channel_taken`).
   * After a reconnect, or a session that could not be resumed, the channel is registered again.
   */
  register(channel, handler, { kind, codec } = {}) {
    const payload = kind && codec ? utf8Encode(JSON.stringify({ kind, codec })) : null;
    const registration = { handler, payload, granted: false };
    const granted = new Promise((resolve, reject) => { registration.settle = { resolve, reject }; });
    this.#registrations.set(channel, registration);
    this.#sendRegister(channel, registration);
    return granted;
  }

  /** Gives `channel` back (UNREGISTER); resolves once the server has answered. */
  async unregister(channel) {
    if (!this.#registrations.delete(channel)) return;
    await this.#request({ type: FrameType.UNREGISTER, channel }).catch(() => {});
  }

  /** Closes the connection for good: requests in flight reject (`closed`), streams end; a session is ended (END). */
  async close() {
    if (this.state === 'closed') return;
    const ws = this.#ws;
    if (this.#session && this.state === 'connected') ws?.send(encodeFrame({ type: FrameType.END }));
    this.#forgetSession();
    this.#restart = null;
    this.#setState('closed');
    this.#sleep?.wake();
    this.#connectionEnded(new PlatformException('closed', 'the client was closed'));
    for (const stream of [...this[STREAMS].values()]) stream[DISCONNECTED](null);
    if (!ws || ws.readyState >= 2) return;
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, 1000);
      ws.addEventListener('close', () => { clearTimeout(timer); resolve(); });
      ws.close(1000);
    });
  }

  #unavailable() {
    return this.state === 'closed'
      ? new PlatformException('closed', 'the client was closed')
      : new PlatformException('disconnected', 'not connected to the server');
  }

  /** The next request id: u32, never 0, skipping ids whose answers are pending. */
  #nextId() {
    do this.#lastId = this.#lastId === MAX_ID ? 1 : this.#lastId + 1;
    while (this.#pending.has(this.#lastId));
    return this.#lastId;
  }

  /** A PlatformException if the frame is larger than the server takes, else null. */
  #checkSize(frame) {
    const max = this.welcome?.maxFrame;
    if (max == null || frame.length - 4 <= max) return null;
    return new PlatformException('frame_too_large', `a frame of ${frame.length - 4} bytes exceeds the server's maxFrame of ${max}`);
  }

  /** The caller gave up on request `id`: reject it now, CANCEL it, keep the id until its answer comes. */
  #abandon(id, reason) {
    const entry = this.#pending.get(id);
    if (!entry || entry.abandoned) return;
    this.#pending.set(id, { abandoned: true, resolve() {}, reject() {} });
    this.#send({ type: FrameType.CANCEL, id });
    entry.reject(reason);
  }

  #send(frame) {
    const bytes = encodeFrame(frame);
    if (!this.#checkSize(bytes)) this.#write(bytes);
  }

  /** Writes a frame of the client's stream: at once without a session, else in order through what is held. */
  #write(bytes) {
    if (!this.#session && !this.#restart) return this.#ws?.send(bytes);
    this.#held.push(bytes);
    this.#flush();
  }

  // MARK: Sessions

  /** A session granted by a WELCOME's `session`; positions count bytes of whole frames (resumption.md). */
  #makeSession({ token, ttlMs, ackBytes, ackMs }) {
    this.#unansweredResumes = [];  // a late HELLO names an older token
    return {
      token, ttlMs, ackBytes, ackMs,
      /** Bytes of the server's stream received and handled, and the last position acknowledged. */
      received: 0, acknowledged: 0, ackTimer: null,
      /** Bytes of the client's stream written, and the frames written and not acknowledged, oldest first. */
      sent: 0, kept: [], keptBytes: 0,
      /** When the connection was lost, and whether the one try after the time to live was made. */
      lostAt: 0, lastTry: false,
    };
  }

  /** Writes held frames while the connection is up and what is kept stays within the bound (one frame at least). */
  #flush() {
    const s = this.#session;
    if (this.state !== 'connected' || !this.#ws) return;
    if (!s) {
      // The session ended (END) or none was granted after one was lost: a plain wire-v1 connection.
      for (const bytes of this.#held.splice(0)) this.#ws.send(bytes);
      return;
    }
    while (this.#held.length > 0) {
      const bytes = this.#held[0];
      if (s.kept.length > 0 && s.keptBytes + bytes.length > this.#sessionOptions.maxUnacknowledgedBytes) return;
      this.#held.shift();
      s.kept.push({ start: s.sent, bytes });
      s.keptBytes += bytes.length;
      s.sent += bytes.length;
      this.#ws.send(bytes);
    }
  }

  /** The server has received the client's stream up to `position`: forget what lies before it. */
  #release(position) {
    const s = this.#session;
    while (s.kept.length > 0 && s.kept[0].start + s.kept[0].bytes.length <= position) {
      s.keptBytes -= s.kept.shift().bytes.length;
    }
  }

  /** `n` more bytes of the server's stream were handled: acknowledge per ackBytes/ackMs. */
  #received(n) {
    const s = this.#session;
    s.received += n;
    if (s.received - s.acknowledged >= s.ackBytes) return this.#acknowledge();
    s.ackTimer ??= setTimeout(() => this.#acknowledge(), s.ackMs);
  }

  /** Sends POSITION with the received position, if it says anything new (a POSITION is not in the stream). */
  #acknowledge() {
    const s = this.#session;
    if (!s) return;
    clearTimeout(s.ackTimer);
    s.ackTimer = null;
    if (s.received <= s.acknowledged || this.state !== 'connected' || !this.#ws) return;
    s.acknowledged = s.received;
    const payload = new Uint8Array(8);
    new DataView(payload.buffer).setBigUint64(0, BigInt(s.received));
    this.#ws.send(encodeFrame({ type: FrameType.POSITION, payload }));
  }

  #forgetSession() {
    clearTimeout(this.#session?.ackTimer);
    this.#session = null;
  }

  /**
   * The session cannot go on (resumption.md, "What the client does then"): requests written on it fail
   * with `session_lost`, requests forwarded to this client are forgotten, and what is reported once the
   * next connection is up is noted. Requests not yet written wait for the new session.
   */
  #loseSession(reason) {
    this.#forgetSession();
    this.#unansweredResumes = [];  // a late HELLO names the lost session's token, not the next one's
    this.#epoch++;
    const unwritten = new Set();
    for (const bytes of this.#held) {
      const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
      if (REQUEST_TYPES.has(view.getUint8(4))) unwritten.add(view.getUint32(8));
    }
    const failed = [];
    const lost = new PlatformException('session_lost', `the session could not be resumed (${reason}): the server may have handled this request`);
    for (const [id, entry] of [...this.#pending]) {
      if (id === this.#hello?.id) continue;
      if (unwritten.has(id) && !entry.redone && !entry.abandoned) continue;
      this.#pending.delete(id);
      unwritten.delete(id);
      if (entry.redone || entry.abandoned) continue;  // listens and REGISTERs are made again; the caller gave up
      if (entry.type === FrameType.MESSAGE) failed.push({ id, channel: entry.channel });  // not an UNREGISTER
      entry.reject(lost);
    }
    // Only requests still waiting go on: DEMAND, CANCEL and answers belong to the old session.
    this.#held = this.#held.filter((bytes) => unwritten.has(new DataView(bytes.buffer, bytes.byteOffset).getUint32(8))
      && REQUEST_TYPES.has(bytes[4]));
    this.#restart ??= { reason, streams: [...this[STREAMS].keys()], channels: [...this.#registrations.keys()], failed };
  }

  /** The WELCOME of this connection's HELLO: sets up the session it grants, resumes, or falls back. */
  #welcomed(welcome, resuming) {
    this.welcome = welcome;
    const granted = welcome.session && typeof welcome.session.token === 'string' ? welcome.session : null;
    if (resuming && !granted) {
      this.#loseSession('unsupported');
    } else if (resuming && granted.resumed === true) {
      if (!this.#resumeAt(granted.position)) {
        this.#loseSession('position');
        throw new PlatformException('session_lost', 'the server resumed from a position this client did not keep');
      }
    } else {
      if (resuming) this.#loseSession('unknown');  // a new session in answer to a resume: the old one is gone
      this.#session = granted && this.#sessionOptions ? this.#makeSession(granted) : null;
    }
    this.#setState('connected');
    this.goingAway = false;
    if (resuming && this.#session) {
      this.#flush();
      return this.#emit('resumed', { token: this.#session.token });
    }
    for (const [channel, registration] of this.#registrations) this.#sendRegister(channel, registration);
    for (const stream of this[STREAMS].values()) stream[LISTEN]();
    this.#flush();
    const restart = this.#restart;
    this.#restart = null;
    if (restart) this.#emit('restarted', restart);
  }

  /** The server resumed from `position` of the client's stream: write again what it missed. */
  #resumeAt(position) {
    const s = this.#session;
    const oldest = s.kept.length > 0 ? s.kept[0].start : s.sent;
    if (!Number.isSafeInteger(position) || position < oldest || position > s.sent) return false;
    if (position < s.sent && !s.kept.some(({ start }) => start === position)) return false;
    this.#release(position);
    s.acknowledged = s.received;  // the HELLO's position counts as a POSITION
    for (const { bytes } of s.kept) this.#ws.send(bytes);
    return true;
  }

  /**
   * Sends REGISTER for `registration`, the first time or on a new connection or session. A lost
   * connection registers it again on the next one (a REGISTER lost with a session is dropped, not
   * failed, and sent again by #welcomed); a refusal gives it up, and is told as an `error` event
   * when the channel had been granted before.
   */
  #sendRegister(channel, registration) {
    this.#request({ type: FrameType.REGISTER, channel, payload: registration.payload }, { [REDONE]: true }).then(() => {
      registration.granted = true;
      registration.settle.resolve();
    }, (error) => {
      if (this.#registrations.get(channel) !== registration) return registration.settle.reject(error);
      if (error.code === 'disconnected' && this.willReconnect) return;
      this.#registrations.delete(channel);
      if (registration.granted) this.#emit('error', error);
      registration.settle.reject(error);
    });
  }

  // MARK: Connecting

  /**
   * Opens a WebSocket, sends HELLO (asking to resume the session when there is one) and resolves once
   * a WELCOME has set the connection up; a `cannot_resume` is followed on the same connection by a
   * HELLO for a new session.
   */
  #open() {
    return new Promise((resolve, reject) => {
      let ws;
      try {
        ws = new this.#WebSocket(this.#url);
      } catch (error) {
        return reject(new PlatformException('connection_failed', String(error?.message ?? error)));
      }
      ws.binaryType = 'arraybuffer';
      this.#ws = ws;
      this.#taken = false;
      const hello = (resuming) => {
        const id = this.#nextId();
        this.#hello = { id, resuming };
        const s = this.#session;
        const session = resuming ? { token: s.token, position: s.received } : this.#sessionOptions ? {} : undefined;
        this.#pending.set(id, {
          resolve: (payload) => {
            this.#hello = null;
            try {
              this.#welcomed(JSON.parse(utf8Decode(payload ?? new Uint8Array()) || '{}'), resuming);
            } catch (error) {
              ws.close(4002);
              this.#closed(ws);
              return reject(error);
            }
            resolve();
          },
          reject: (error) => {
            this.#hello = null;
            if (resuming && error.code === 'cannot_resume' && ws === this.#ws) {
              const reason = error.details instanceof Map ? String(error.details.get('reason') ?? 'unknown') : 'unknown';
              this.#loseSession(reason);
              return hello(false);
            }
            // A refusal (an ERROR such as unauthorized) is permanent; a lost connection may be retried.
            reject(error.code === 'disconnected'
              ? new PlatformException('connection_failed', `cannot connect to ${this.#url}`)
              : Object.assign(error, { permanent: true }));
          },
        });
        const body = JSON.stringify({ version: 1, client: this.#name, token: this.#token, session });
        ws.send(encodeFrame({ type: FrameType.HELLO, id, payload: utf8Encode(body) }));
      };
      ws.addEventListener('open', () => hello(this.#session !== null));
      ws.addEventListener('message', (event) => this.#receive(ws, event.data));
      // Node 20's WebSocket reports a failed connection with 'error' alone; browsers follow with 'close'.
      // (Once connected, the promise is settled and the rejection below does nothing.)
      const lost = () => {
        this.#closed(ws);
        reject(new PlatformException('connection_failed', `cannot connect to ${this.#url}`));
      };
      ws.addEventListener('error', lost);
      ws.addEventListener('close', lost);
    });
  }

  /** The WebSocket `ws` is gone (or never opened). */
  #closed(ws) {
    if (ws !== this.#ws) return;
    this.#ws = null;
    if (ws.readyState < 2) ws.close();
    const wasConnected = this.state === 'connected';
    if (this.#taken) {
      const now = Date.now();
      this.#unansweredResumes = this.#unansweredResumes.filter((until) => until > now);
      // Most likely an earlier connection of this client's, read late: resume again. Else a thief.
      if (this.#unansweredResumes.length > 0) this.#unansweredResumes.shift();
      else this.#loseSession('taken');
    }
    if ((this.#session || this.#restart) && this.state !== 'closed') {
      // The session is parked on the server: keep everything and resume on the next connection.
      const hello = this.#hello && this.#pending.get(this.#hello.id);
      if (hello) {
        if (this.#hello.resuming) this.#unansweredResumes.push(Date.now() + LATE_HELLO_WINDOW_MS);
        this.#pending.delete(this.#hello.id);
        hello.reject(new PlatformException('disconnected', 'the connection to the server was lost'));
      }
      if (!wasConnected) return;
      if (this.#session) Object.assign(this.#session, { lostAt: Date.now(), lastTry: false });
      this.#setState('reconnecting');
      return void this.#reconnectLoop();
    }
    if (wasConnected && this.#reconnect) this.#setState('reconnecting');
    this.#connectionEnded(new PlatformException('disconnected', 'the connection to the server was lost'));
    if (!wasConnected) return;  // a failed attempt: whoever started it decides what follows
    if (this.#reconnect) return void this.#reconnectLoop();
    this.#setState('closed');
    for (const stream of [...this[STREAMS].values()]) stream[DISCONNECTED](new PlatformException('disconnected', 'the connection to the server was lost'));
  }

  /** Forgets the socket and fails every request waiting on it. */
  #connectionEnded(error) {
    this.#ws = null;
    this.#held = [];
    this.#epoch++;
    const pending = [...this.#pending.values()];
    this.#pending.clear();
    for (const entry of pending) entry.reject(error);
  }

  /**
   * Retries with exponential backoff and jitter until connected, refused for good, or closed. A session
   * is tried for its time to live after the loss and once more; then it is lost (`expired`).
   */
  async #reconnectLoop() {
    const { initialDelayMs, maxDelayMs } = this.#reconnect;
    for (let attempt = 0; this.state === 'reconnecting'; attempt++) {
      const delay = Math.min(maxDelayMs, initialDelayMs * 2 ** Math.min(attempt, 30));
      await new Promise((wake) => {
        const timer = setTimeout(wake, delay * (0.5 + Math.random() / 2));
        this.#sleep = { wake: () => { clearTimeout(timer); wake(); } };
      });
      this.#sleep = null;
      if (this.state !== 'reconnecting') return;
      const s = this.#session;
      if (s && Date.now() - s.lostAt > s.ttlMs) {
        if (s.lastTry) this.#loseSession('expired');
        s.lastTry = true;
      }
      try {
        return await this.#open();
      } catch (error) {
        if (error.permanent) {
          this.#forgetSession();
          this.#restart = null;
          this.#setState('closed');
          this.#connectionEnded(error);
          for (const stream of [...this[STREAMS].values()]) stream[DISCONNECTED](error);
          return;
        }
      }
    }
  }

  // MARK: Input

  #receive(ws, data) {
    if (ws !== this.#ws) return;
    let frame;
    try {
      if (!(data instanceof ArrayBuffer)) throw new FormatError('a text message in binary mode');
      frame = decodeFrame(data);
    } catch {
      // The server broke the protocol: drop the connection. (A script may close only with 1000 or
      // 3000-4999, so not with 1002; 4002 says the same in the application's range.)
      ws.close(4002);
      return this.#closed(ws);
    }
    const session = this.#session;
    const inStream = session !== null && this.state === 'connected' && this.#inStream(frame);
    this.#handle(ws, frame);
    // Counted once handled, as whole frames; not if the session ended or was lost meanwhile.
    if (inStream && this.#session === session && this.#ws === ws) this.#received(data.byteLength);
  }

  /** Whether a frame the server sent is in its session stream (resumption.md, "Streams and positions"). */
  #inStream(frame) {
    switch (frame.type) {
      case FrameType.WELCOME:
      case FrameType.POSITION:
      case FrameType.END:
        return false;
      case FrameType.ERROR:
        return frame.id !== this.#hello?.id && !CLOSING_ERRORS.has(errorOfFrame(frame.payload).code);
      default:
        return true;
    }
  }

  #handle(ws, frame) {
    switch (frame.type) {
      case FrameType.WELCOME:
      case FrameType.REPLY: {
        const entry = this.#answer(frame.id);
        entry?.answered?.();
        return entry?.resolve(frame.payload);
      }
      case FrameType.ERROR: {
        const error = errorOfFrame(frame.payload);
        if (error.code === 'session_taken' && frame.id === 0 && this.#session) {
          this.#taken = true;
          return undefined;
        }
        const entry = this.#answer(frame.id);
        entry?.answered?.();
        return entry ? entry.reject(error) : this.#emit('error', error);
      }
      case FrameType.MESSAGE:
        if (frame.id === 0) return this[STREAMS].get(frame.channel)?.[DELIVER](frame.payload);
        return this.#serve(frame);
      case FrameType.PING:
        return this.#send({ type: FrameType.PONG, id: frame.id, payload: frame.payload });
      case FrameType.GOAWAY:
        this.goingAway = true;
        return this.#emit('goaway', safeJSON(frame.payload)?.reason ?? '');
      case FrameType.POSITION:
        if (this.#session && frame.payload?.length === 8) {
          const position = new DataView(frame.payload.buffer, frame.payload.byteOffset, 8).getBigUint64(0);
          this.#release(Number(position));
          this.#flush();
        }
        return undefined;
      case FrameType.END:
        return this.#ended(safeJSON(frame.payload)?.reason ?? 'ended');
      default:
        return undefined;  // PONG, CANCEL (the handler's answer may still come), and types a server does not send
    }
  }

  /** A request forwarded to a channel this client holds: its handler's result is the REPLY (none held: a null REPLY). */
  #serve({ id, channel, payload }) {
    const handler = this.#registrations.get(channel)?.handler;
    const epoch = this.#epoch;
    const reply = (answer) => {
      if (epoch === this.#epoch && this[WRITABLE]) this.#send({ type: FrameType.REPLY, id, payload: answer ?? null });
    };
    if (!handler) return reply(null);
    Promise.resolve().then(() => handler(payload)).then(reply, (error) => {
      reply(null);
      queueMicrotask(() => { throw error; });
    });
  }

  /** The server ended the session (END): the connection goes on as plain wire-v1; streams may have missed events. */
  #ended(reason) {
    if (!this.#session) return;
    const s = this.#session;
    this.#forgetSession();
    this.#unansweredResumes = [];  // a late HELLO names the ended session's token
    s.kept = [];
    this.#flush();
    this.#emit('ended', { reason, streams: [...this[STREAMS].keys()] });
  }

  /** Takes the pending entry answered by a frame with `id`. */
  #answer(id) {
    const entry = this.#pending.get(id);
    this.#pending.delete(id);
    return entry;
  }

  /** Whether a stream's end of stream is the server shutting down, to be resumed by reconnecting. */
  get resumesAfterGoaway() {
    return this.goingAway && this.#reconnect !== null;
  }

  /** Whether a stream should wait for the next connection rather than fail. */
  get willReconnect() {
    return this.#reconnect !== null && (this.state === 'reconnecting' || this.state === 'connected');
  }
}

function safeJSON(payload) {
  try {
    return payload ? JSON.parse(utf8Decode(payload)) : null;
  } catch {
    return null;
  }
}

/** The PlatformException of an ERROR frame's JSON `{"code","message","details"}`. */
function errorOfFrame(payload) {
  let body = null;
  try {
    body = payload ? parseJSON(payload) : null;
  } catch { /* a server ERROR that is not JSON keeps the generic code below */ }
  const field = (key) => (body instanceof Map ? body.get(key) : undefined);
  return new PlatformException(String(field('code') ?? 'error'), field('message') ?? null, field('details') ?? null);
}

// MARK: Channels

/** Calls methods on a server channel: Flutter's MethodChannel. */
export class MethodChannel {
  constructor(name, client, codec = new StandardMethodCodec()) {
    this.name = name;
    this.client = client;
    this.codec = codec;
  }

  /**
   * Calls `method`; resolves with its result. Rejects with PlatformException (an error envelope or an
   * ERROR frame), MissingPluginException (not implemented, or no handler), or the signal's reason.
   */
  async invokeMethod(method, args = null, options = {}) {
    const reply = await this.client.request(this.name, this.codec.encodeMethodCall({ method, args }), options);
    if (reply === null) throw new MissingPluginException(`No implementation found for method ${method} on channel ${this.name}`);
    return this.codec.decodeEnvelope(reply);
  }

  /**
   * Holds the channel on the server (REGISTER) and answers other clients' calls with `handler({method,
   * args})`: its result (or a promise of it) is the success envelope, a thrown PlatformException the
   * error envelope, a thrown MissingPluginException "not implemented" (a null reply). A null handler gives
   * the channel back. Resolves once the server has granted the channel (rejects with `channel_taken`).
   */
  setMethodCallHandler(handler) {
    if (handler === null) return this.client.unregister(this.name);
    return this.client.register(this.name, async (payload) => {
      let call;
      try {
        call = this.codec.decodeMethodCall(payload);
      } catch (error) {
        return this.codec.encodeErrorEnvelope('bad_call', String(error.message));
      }
      try {
        return this.codec.encodeSuccessEnvelope(await handler(call));
      } catch (error) {
        if (error instanceof MissingPluginException) return null;
        if (error instanceof PlatformException) return this.codec.encodeErrorEnvelope(error.code, error.message, error.details);
        return this.codec.encodeErrorEnvelope('error', String(error?.message ?? error));
      }
    }, { kind: 'method', codec: codecName(this.codec) });
  }
}

/** The REGISTER payload's name of a codec of this module, or undefined (an opaque channel). */
function codecName(codec) {
  if (codec instanceof StandardMethodCodec || codec instanceof StandardMessageCodec) return 'standard';
  if (codec instanceof JSONMethodCodec || codec instanceof JSONMessageCodec) return 'json';
  if (codec instanceof StringCodec) return 'string';
  if (codec instanceof BinaryCodec) return 'binary';
  return undefined;
}

/** Sends messages to a server channel: Flutter's BasicMessageChannel. */
export class BasicMessageChannel {
  constructor(name, client, codec = new StandardMessageCodec()) {
    this.name = name;
    this.client = client;
    this.codec = codec;
  }

  /** Sends `message` and resolves with the reply (a null reply decodes as the codec's null). */
  async send(message, options = {}) {
    const reply = await this.client.request(this.name, this.codec.encodeMessage(message), options);
    return this.codec.decodeMessage(reply);
  }

  /**
   * Holds the channel on the server (REGISTER) and answers other clients' messages with
   * `handler(message)` (its result, or a promise of it, is the reply). A null handler gives the channel
   * back. Resolves once the server has granted the channel (rejects with `channel_taken`).
   */
  setMessageHandler(handler) {
    if (handler === null) return this.client.unregister(this.name);
    return this.client.register(this.name, async (payload) => this.codec.encodeMessage(await handler(this.codec.decodeMessage(payload))),
      { kind: 'message', codec: codecName(this.codec) });
  }
}

/** Listens to a server event channel: Flutter's EventChannel. */
export class EventChannel {
  constructor(name, client, codec = new StandardMethodCodec()) {
    this.name = name;
    this.client = client;
    this.codec = codec;
  }

  /**
   * The channel's events as an async iterable; `listen(args)` is sent when iteration starts.
   * Options: `signal` (aborting cancels the stream; the iterator throws the reason), `credit` (pace the
   * stream by DEMAND with this window from the start), `highWaterMark` (events buffered before a push
   * stream is switched to credit; default 256).
   */
  receiveBroadcastStream(args = null, options = {}) {
    return new EventStream(this, args, options);
  }
}

/**
 * The events of one `listen`. Iterate it once with `for await`; an error event makes the iterator throw
 * its PlatformException (and cancels the stream), end of stream ends the loop. After a reconnect the
 * stream is listened to again with the same arguments and credit.
 *
 * Flow control (wire-v1 section 7a): with `credit`, at most that many events are granted and not yet
 * taken by the consumer (granted, in flight or buffered); credit is topped up as the consumer takes
 * events. A push stream whose buffer reaches the high-water mark, or that is paused, switches to credit
 * with the high-water mark as window (its first grant is 1 event: a DEMAND cannot grant 0).
 * `pause()` stops granting credit, so the server stops sending; `resume()` grants again.
 */
export class EventStream {
  #channel;
  #args;
  #signal;
  #highWaterMark;
  #window;
  #outstanding = 0;
  #paused = false;
  #buffer = [];
  #waiter = null;
  /** 'idle' (not listened yet), 'active', or 'done' (nothing more will be buffered). */
  #phase = 'idle';
  /** Whether the current listen's answer has been read: events on the channel before it are not this stream's. */
  #answered = false;
  /** Whether the current listen was accepted, so that events on the channel are this stream's. */
  #accepted = false;
  /**
   * Event payloads read after the listen's answer but before its promise callbacks ran (a WebSocket
   * may deliver several messages first; Node's does). They wait here until the answer says whether
   * the listen was accepted.
   */
  #early = [];
  #markReady;

  /** Resolves with true once the server has accepted the first `listen`, or false if the stream ended first. */
  ready = new Promise((resolve) => { this.#markReady = resolve; });

  constructor(channel, args, { signal, credit, highWaterMark = 256 } = {}) {
    if (credit != null && !(Number.isInteger(credit) && credit > 0 && credit < MAX_ID)) {
      throw new RangeError('credit must be an integer from 1 to 0xFFFFFFFE');
    }
    if (!(Number.isInteger(highWaterMark) && highWaterMark > 0 && highWaterMark < MAX_ID)) {
      throw new RangeError('highWaterMark must be an integer from 1 to 0xFFFFFFFE');
    }
    this.#channel = channel;
    this.#args = args;
    this.#signal = signal;
    this.#highWaterMark = highWaterMark;
    this.#window = credit ?? null;
  }

  /** Events received and not taken by the consumer yet. */
  get buffered() {
    return this.#buffer.filter((item) => 'value' in item).length;
  }

  get paused() {
    return this.#paused;
  }

  /** Stops granting credit: the server sends no more events than already granted. */
  pause() {
    this.#paused = true;
    this.#updateCredit();
  }

  /** Grants credit again as the consumer takes events. */
  resume() {
    this.#paused = false;
    this.#updateCredit();
  }

  /** Stops the stream (the loop ends): sends `cancel(args)` and resolves when the server has answered. */
  async cancel() {
    const stopped = this.#stopListening();
    this.#finish({ end: true }, { discard: true });
    await stopped;
  }

  [Symbol.asyncIterator]() {
    if (this.#phase !== 'idle') throw new Error('an EventStream can be iterated only once');
    this.#start();
    return {
      next: () => this.#next(),
      return: async () => {
        await this.cancel();
        return { value: undefined, done: true };
      },
    };
  }

  #start() {
    this.#phase = 'active';
    const { client, name } = this.#channel;
    if (this.#signal?.aborted) return this.#finish({ error: this.#signal.reason }, { discard: true });
    this.#signal?.addEventListener('abort', this.#abort, { once: true });
    if (client.state === 'closed') return this.#finish({ error: new PlatformException('closed', 'the client was closed') });
    // One stream per channel: a new listen ends the old one, and tells the server first, so that the
    // DEMAND below credits the new stream rather than the old one.
    const previous = client[STREAMS].get(name);
    if (previous) {
      previous.#stopListening();
      previous[DISCONNECTED](null);
    }
    client[STREAMS].set(name, this);
    // With a session, a listen made while reconnecting waits for the connection; otherwise it is made on connecting.
    if (client.state === 'connected' || (client.state === 'reconnecting' && client.session)) this[LISTEN]();
  }

  /** Sends `listen(args)` on the current connection, preceded by DEMAND when the stream is paced. */
  [LISTEN]() {
    const { client, name, codec } = this.#channel;
    this.#answered = false;
    this.#accepted = false;
    this.#early = [];
    this.#outstanding = 0;
    // Paused, it still needs credit mode on the new connection: a grant of 1, the least a DEMAND can say.
    if (this.#window !== null) this.#grant(this.#paused ? 1 : Math.max(1, this.#window - this.buffered));
    let payload;
    try {
      payload = codec.encodeMethodCall({ method: 'listen', args: this.#args });
    } catch (error) {
      return this.#finish({ error });
    }
    const answered = () => { if (this.#isCurrent()) this.#answered = true; };
    client.request(name, payload, { [ANSWERED]: answered, [REDONE]: true }).then(
      (reply) => {
        if (!this.#isCurrent()) return;
        if (reply === null) throw new MissingPluginException(`No implementation found for method listen on channel ${name}`);
        codec.decodeEnvelope(reply);
        this.#accepted = true;
        this.#markReady(true);
        const early = this.#early;
        this.#early = [];
        for (const payload of early) this[DELIVER](payload);
      },
      (error) => {
        // Listened again once reconnected (going_away: the server began to stop as this listen arrived).
        if (error.code === 'disconnected' && client.willReconnect) return;
        if (error.code === 'going_away' && client.resumesAfterGoaway) return;
        throw error;
      },
    ).catch((error) => {
      if (this.#isCurrent()) this.#finish({ error });
    });
  }

  /** An event frame's payload on this stream's channel (null = end of stream). */
  [DELIVER](payload) {
    if (!this.#accepted) {
      if (this.#phase === 'active' && this.#answered) this.#early.push(payload);  // see #early
      // Before the answer: an event of the stream this one replaced, still on its way.
      return;
    }
    if (payload === null) {
      if (this.#channel.client.resumesAfterGoaway) return;  // the server is stopping: listen again after reconnecting
      return this.#finish({ end: true });
    }
    this.#outstanding = Math.max(0, this.#outstanding - 1);
    try {
      this.#push({ value: this.#channel.codec.decodeEnvelope(payload) });
    } catch (error) {
      this.#push({ error: error instanceof PlatformException ? error : new PlatformException('bad_event', error.message) });
    }
    this.#updateCredit();
  }

  /** The connection is gone for good (error), or the client closed or another listen replaced this one (null). */
  [DISCONNECTED](error) {
    this.#finish(error ? { error } : { end: true });
  }

  #abort = () => {
    if (this.#phase === 'done') return;
    this.#stopListening();
    this.#finish({ error: this.#signal.reason }, { discard: true });
  };

  /** If this stream is the channel's listener: no longer, and tell the server (resolves on its answer). */
  async #stopListening() {
    if (!this.#isCurrent()) return;
    const { client, name, codec } = this.#channel;
    client[STREAMS].delete(name);
    if (!client[WRITABLE]) return;
    const payload = codec.encodeMethodCall({ method: 'cancel', args: this.#args });
    await client.request(name, payload).catch(() => {});  // "no active stream" (it had just ended) is fine too
  }

  #isCurrent() {
    return this.#channel.client[STREAMS].get(this.#channel.name) === this;
  }

  /** Ends the stream with a last item (`{end}` or `{error}`), after the buffered events unless `discard`. */
  #finish(item, { discard = false } = {}) {
    if (this.#isCurrent()) this.#channel.client[STREAMS].delete(this.#channel.name);
    if (this.#phase === 'done' && !discard) return;
    this.#phase = 'done';
    this.#signal?.removeEventListener('abort', this.#abort);
    this.#markReady(false);
    if (discard) this.#buffer = [];
    this.#push(item);
  }

  #push(item) {
    if (this.#waiter) {
      const waiter = this.#waiter;
      this.#waiter = null;
      this.#settle(item, waiter);
    } else {
      this.#buffer.push(item);
    }
  }

  #next() {
    if (this.#buffer.length === 0) {
      if (this.#phase === 'done') return Promise.resolve({ value: undefined, done: true });
      return new Promise((resolve, reject) => { this.#waiter = { resolve, reject }; });
    }
    const item = this.#buffer.shift();
    this.#updateCredit();
    return new Promise((resolve, reject) => this.#settle(item, { resolve, reject }));
  }

  /** Hands one item to a consumer: a value, the end, or an error (which also ends the stream). */
  #settle(item, { resolve, reject }) {
    if ('value' in item) return resolve({ value: item.value, done: false });
    if (item.end) return resolve({ value: undefined, done: true });
    // An error event: Dart's await-for stops listening too.
    this.#stopListening();
    this.#finish({ end: true }, { discard: true });
    reject(item.error);
  }

  /** Grants credit as the consumer's pace allows (see the class comment). */
  #updateCredit() {
    if (!this.#isCurrent() || !this.#channel.client[WRITABLE]) return;
    if (this.#window === null) {
      if (!this.#paused && this.#buffer.length < this.#highWaterMark) return;
      this.#window = this.#highWaterMark;
      return this.#grant(1);
    }
    if (this.#paused) return;
    const room = this.#window - this.#buffer.length - this.#outstanding;
    if (room >= Math.ceil(this.#window / 2)) this.#grant(room);
  }

  #grant(n) {
    this.#outstanding += n;
    this.#channel.client.demand(this.#channel.name, n);
  }
}
