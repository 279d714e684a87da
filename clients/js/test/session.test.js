// Resumable sessions (protocol/resumption.md) against a real server, through a proxy that cuts
// connections at random byte offsets. The offsets come from a seeded generator: a failure prints
// CUT_SEED=N, and `CUT_SEED=N node --experimental-websocket --test test/session.test.js` replays it.
import { test, describe, before, after, afterEach } from 'node:test';
import assert from 'node:assert/strict';
import { createServer, connect as tcpConnect } from 'node:net';
import { createHash, randomInt } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  SwitchboardClient, MethodChannel, EventChannel, FrameType, encodeFrame, decodeFrame,
} from '../client.js';
import { TcpSocket } from '../tcp.js';
import { startServer, startWithRetry, stopServers, within, sleep, nextEvent, rejectsWithCode } from './helpers.js';

const seed = Number(process.env.CUT_SEED ?? randomInt(2 ** 31));
const clients = new Set();
const proxies = new Set();

after(async () => {
  await Promise.all([...clients].map((client) => client.close()));
  for (const proxy of proxies) proxy.close();
  stopServers();
});

/** mulberry32: a small seeded generator of floats in [0, 1). */
function generator(state) {
  return () => {
    state = (state + 0x6d2b79f5) | 0;
    let t = Math.imul(state ^ (state >>> 15), 1 | state);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * A TCP proxy to a server's port. While `cutting`, each connection is cut (both sockets destroyed) once
 * a random number of bytes from `minBytes` to `maxBytes` has passed, counted over both directions, in
 * the middle of a chunk: what lies past the offset is not delivered. While `blocked`, connections are
 * closed as they come. `cutAll()` cuts every connection now.
 */
class CuttingProxy {
  cutting = false;
  blocked = false;
  cuts = 0;
  #random;
  #target;
  #range;
  #server;
  #pairs = new Set();

  constructor(targetPort, { seed: initial, minBytes = 600, maxBytes = 6000 } = {}) {
    this.#target = targetPort;
    this.#random = generator(initial);
    this.#range = [minBytes, maxBytes];
  }

  async listen() {
    this.#server = createServer((downstream) => this.#accept(downstream));
    await new Promise((resolve) => this.#server.listen(0, '127.0.0.1', resolve));
    proxies.add(this);
    this.port = this.#server.address().port;
    return this;
  }

  #accept(downstream) {
    if (this.blocked) return void downstream.destroy();
    const upstream = tcpConnect({ host: '127.0.0.1', port: this.#target });
    const [min, max] = this.#range;
    const pair = { downstream, upstream, budget: min + Math.floor(this.#random() * (max - min)) };
    this.#pairs.add(pair);
    const relay = (from, to) => from.on('data', (chunk) => {
      if (this.cutting && chunk.length >= pair.budget) {
        to.write(chunk.subarray(0, pair.budget));
        return this.#cut(pair);
      }
      if (this.cutting) pair.budget -= chunk.length;
      to.write(chunk);
    });
    relay(downstream, upstream);
    relay(upstream, downstream);
    const end = () => {
      this.#pairs.delete(pair);
      downstream.destroy();
      upstream.destroy();
    };
    for (const socket of [downstream, upstream]) socket.on('close', end).on('error', end);
  }

  #cut(pair) {
    if (!this.#pairs.delete(pair)) return;
    this.cuts++;
    // Let the prefix written just before go out, then drop both ends at once.
    setImmediate(() => {
      pair.downstream.destroy();
      pair.upstream.destroy();
    });
  }

  cutAll() {
    for (const pair of [...this.#pairs]) this.#cut(pair);
  }

  close() {
    this.cutAll();
    this.#server?.close();
  }
}

/** Runs `body`, naming the seed in the error if it fails. */
async function seeded(body) {
  try {
    await body();
  } catch (error) {
    error.message = `${error.message} (CUT_SEED=${seed})`;
    throw error;
  }
}

/** Rejects as soon as one of `clients` reports `restarted`: a resume that should have worked did not. */
function failOnRestart(...clients) {
  return new Promise((_, reject) => {
    for (const client of clients) {
      client.on('restarted', ({ reason }) => reject(new Error(`the session was restarted (${reason}) instead of resumed`)));
    }
  });
}

/** The URL and WebSocket implementation of `transport` ('ws' or 'tcp') to `port`. */
function endpoint(transport, port) {
  return transport === 'tcp'
    ? { url: `tcp://127.0.0.1:${port}`, WebSocket: TcpSocket }
    : { url: `ws://127.0.0.1:${port}/`, WebSocket: globalThis.WebSocket };
}

/** A client of `port` over `transport`, with a session unless `session: false`; it counts its reports. */
async function connect(transport, port, { session = true, ...options } = {}) {
  const { url, WebSocket } = endpoint(transport, port);
  const client = await SwitchboardClient.connect(url, {
    name: 'js-session-test', session, reconnect: { initialDelayMs: 10, maxDelayMs: 200 }, WebSocket, ...options,
  });
  clients.add(client);
  client.reports = { resumed: 0, restarted: [], ended: [] };
  client.on('resumed', () => { client.reports.resumed++; });
  client.on('restarted', (report) => client.reports.restarted.push(report));
  client.on('ended', (report) => client.reports.ended.push(report));
  return client;
}

/** Sends one HELLO on a new raw connection and resolves with `{socket, answer}` (the decoded frame). */
async function rawHello(port, hello) {
  const socket = new TcpSocket(`tcp://127.0.0.1:${port}`);
  await new Promise((resolve) => socket.addEventListener('open', resolve, { once: true }));
  const answer = nextFrame(socket);
  socket.send(encodeFrame({ type: FrameType.HELLO, id: 1, payload: new TextEncoder().encode(JSON.stringify({ version: 1, ...hello })) }));
  return { socket, answer: await within(30_000, 'the answer to a HELLO', answer) };
}

function nextFrame(socket) {
  return new Promise((resolve) => socket.addEventListener('message', (event) => resolve(decodeFrame(event.data)), { once: true }));
}

const json = (frame) => JSON.parse(new TextDecoder().decode(frame.payload));

/** A holder of `channel` on `client` whose handler is `handler(args)` (a method channel). */
async function hold(client, channel, handler) {
  await new MethodChannel(channel, client).setMethodCallHandler(({ args }) => handler(args));
}

for (const loops of [1, 4]) {
  for (const transport of ['tcp', 'ws']) {
    // The server does not yet resume a WebSocket session on another loop (resumption.md's status: it
    // answers `unknown`); these run and report, without failing the suite, until it does.
    describe(`resuming through cuts (--loops ${loops}, over ${transport === 'ws' ? 'WebSocket' : 'TCP'})`, { timeout: 180_000 }, () => {
      let server;
      let proxy;
      before(async () => {
        server = await startServer({ args: ['--loops', String(loops)] });
        proxy = await new CuttingProxy(server.port, { seed: seed + loops + (transport === 'ws' ? 100 : 0) }).listen();
      });
      afterEach(() => {
        proxy.cutting = false;
        proxy.blocked = false;
      });

      test('numbered events arrive gap-free and without duplicates, pushed or paced by credit', () => seeded(async () => {
        const pushed = await connect(transport, proxy.port);
        const paced = await connect(transport, proxy.port);
        const collect = async (client, options, count) => {
          const values = [];
          const stream = new EventChannel('switchboard/ticker', client).receiveBroadcastStream({ intervalMs: 2 }, options);
          for await (const value of stream) if (values.push(value) === count) break;
          return values;
        };
        proxy.cutting = true;
        const both = Promise.all([collect(pushed, {}, 600), collect(paced, { credit: 8 }, 400)]);
        const [a, b] = await within(120_000, 'the events', Promise.race([both, failOnRestart(pushed, paced)]));
        proxy.cutting = false;
        assert.deepEqual(a, [...Array(600).keys()], 'the pushed stream');
        assert.deepEqual(b, [...Array(400).keys()], 'the paced stream');
        assert.ok(proxy.cuts >= 2, `${proxy.cuts} cuts`);
        assert.ok(pushed.reports.resumed + paced.reports.resumed >= 2, `resumed ${pushed.reports.resumed} + ${paced.reports.resumed}`);
        for (const client of [pushed, paced]) assert.deepEqual(client.reports.restarted, []);
        await Promise.all([pushed.close(), paced.close()]);
      }));

      test('calls in flight at a cut get exactly one real answer, and the holder runs each once', () => seeded(async () => {
        const holder = await connect(transport, server.port, { session: false });
        const runs = new Map();
        await hold(holder, `test/double.${loops}.${transport}`, async (n) => {
          runs.set(n, (runs.get(n) ?? 0) + 1);
          if (n % 7 === 0) await sleep(1);
          return n * 2;
        });
        const caller = await connect(transport, proxy.port);
        const channel = new MethodChannel(`test/double.${loops}.${transport}`, caller);
        proxy.cutting = true;
        const cutsBefore = proxy.cuts;
        const results = [];
        await within(120_000, 'the calls', Promise.race([(async () => {
          for (let batch = 0; batch < 40; batch++) {
            const ns = Array.from({ length: 25 }, (_, i) => batch * 25 + i);
            results.push(...await Promise.all(ns.map((n) => channel.invokeMethod('call', n))));
          }
        })(), failOnRestart(caller)]));
        proxy.cutting = false;
        assert.deepEqual(results, Array.from({ length: 1000 }, (_, n) => n * 2));
        assert.equal(runs.size, 1000);
        assert.deepEqual([...runs.values()].filter((count) => count !== 1), [], 'each call ran once');
        assert.ok(proxy.cuts - cutsBefore >= 2, `${proxy.cuts - cutsBefore} cuts`);
        assert.ok(caller.reports.resumed >= 2, `resumed ${caller.reports.resumed}`);
        assert.deepEqual(caller.reports.restarted, []);
        await Promise.all([holder.close(), caller.close()]);
      }));

      test('a holder cut mid-request answers after resuming, and its callers get the answers', () => seeded(async () => {
        const channelName = `test/held.${loops}.${transport}`;
        const holder = await connect(transport, proxy.port);
        let entered;
        const inHandler = new Promise((resolve) => { entered = resolve; });
        let release;
        const gate = new Promise((resolve) => { release = resolve; });
        await hold(holder, channelName, async (n) => {
          if (n === 1) {
            entered();
            await gate;
          }
          return `answer ${n}`;
        });
        const caller = await connect(transport, server.port, { session: false });
        const channel = new MethodChannel(channelName, caller);
        const first = channel.invokeMethod('call', 1);
        await within(30_000, 'the request reaches the holder', inHandler);
        proxy.blocked = true;
        const reconnecting = nextEvent(holder, 'state', (state) => state === 'reconnecting');
        proxy.cutAll();
        await within(30_000, 'the holder notices the cut', reconnecting);
        release();  // the handler answers while the holder is away: its REPLY waits for the session's next connection
        const second = channel.invokeMethod('call', 2);  // forwarded to the parked holder
        for (const call of [first, second]) call.catch(() => {});  // awaited below, unless a step before fails
        await sleep(300);
        const resumed = nextEvent(holder, 'resumed');
        proxy.blocked = false;
        await within(30_000, 'resumed', Promise.race([resumed, failOnRestart(holder)]));
        assert.equal(await within(30_000, 'the first answer', first), 'answer 1');
        assert.equal(await within(30_000, 'the second answer', second), 'answer 2');
        assert.equal(await channel.invokeMethod('call', 3), 'answer 3', 'the holder keeps answering');
        assert.deepEqual(holder.reports.restarted, []);
        await Promise.all([holder.close(), caller.close()]);
      }));

      test('a session parked past what it may keep is lost: the client reports restarted (overflowed) and listens again', () => seeded(async () => {
        const small = await startServer({ args: ['--loops', String(loops), '--session-bytes', '4096'] });
        const gateProxy = await new CuttingProxy(small.port, { seed }).listen();
        const client = await connect(transport, gateProxy.port);
        const stream = new EventChannel('switchboard/ticker', client).receiveBroadcastStream({ intervalMs: 1 });
        const events = stream[Symbol.asyncIterator]();
        assert.equal((await within(30_000, 'event', events.next())).value, 0);
        gateProxy.blocked = true;
        gateProxy.cutAll();
        await sleep(1000);  // ~1,000 events of about 30 bytes: past 4,096 bytes while parked
        const restarted = nextEvent(client, 'restarted');
        gateProxy.blocked = false;
        const report = await within(30_000, 'restarted', restarted);
        assert.equal(report.reason, 'overflowed');
        assert.deepEqual(report.streams, ['switchboard/ticker']);
        assert.deepEqual(report.failed, []);
        let value;
        do value = (await within(30_000, 'events of the new listen', events.next())).value; while (value !== 0);
        assert.equal((await within(30_000, 'event', events.next())).value, 1);
        assert.ok(client.session, 'a new session');
        await stream.cancel();
        await client.close();
      }));
    });
  }
}

describe('when a session cannot be resumed', { timeout: 180_000 }, () => {
  test('after a server restart: restarted, calls written on the old session fail with session_lost, channels and streams come back', () => seeded(async () => {
    const server = await startServer();
    const client = await connect('tcp', server.port);
    const other = await connect('tcp', server.port, { session: false, reconnect: false });
    await hold(client, 'test/mine', (args) => `mine ${args}`);
    await hold(other, 'test/never', () => new Promise(() => {}));
    const never = rejectsWithCode(new MethodChannel('test/never', client).invokeMethod('call', 1), 'session_lost');
    const stream = new EventChannel('switchboard/ticker', client).receiveBroadcastStream({ intervalMs: 20 });
    const events = stream[Symbol.asyncIterator]();
    assert.equal((await within(30_000, 'event', events.next())).value, 0);
    const restarted = nextEvent(client, 'restarted');
    server.process.kill('SIGKILL');
    await server.exited;
    const again = await startWithRetry(server.port);
    const report = await within(60_000, 'restarted', restarted);
    assert.equal(report.reason, 'restarted');
    assert.deepEqual(report.streams, ['switchboard/ticker']);
    assert.deepEqual(report.channels, ['test/mine']);
    assert.deepEqual(report.failed.map(({ channel }) => channel), ['test/never']);
    await never;
    let value;
    do value = (await within(30_000, 'events of the new listen', events.next())).value; while (value !== 0);
    const caller = await connect('tcp', again.port, { session: false });
    assert.equal(await new MethodChannel('test/mine', caller).invokeMethod('call', 7), 'mine 7', 'registered again');
    assert.ok(client.session);
    await stream.cancel();
  }));

  test('past its time to live: restarted (expired), and the client goes on with a new session', () => seeded(async () => {
    const server = await startServer({ args: ['--session-ttl', '300'] });
    const proxy = await new CuttingProxy(server.port, { seed }).listen();
    const client = await connect('ws', proxy.port);
    const echo = new MethodChannel('switchboard/echo', client);
    assert.equal(await echo.invokeMethod('echo', 1), 1);
    const token = client.session.token;
    proxy.blocked = true;
    const reconnecting = nextEvent(client, 'state', (state) => state === 'reconnecting');
    proxy.cutAll();
    await within(30_000, 'reconnecting', reconnecting);
    const waiting = echo.invokeMethod('echo', 2);  // made while reconnecting: not written, so not lost
    await sleep(1500);
    const restarted = nextEvent(client, 'restarted');
    proxy.blocked = false;
    const report = await within(30_000, 'restarted', restarted);
    assert.equal(report.reason, 'expired');
    assert.deepEqual(report.failed, []);
    assert.equal(await within(30_000, 'the waiting call', waiting), 2);
    assert.notEqual(client.session.token, token);
  }));

  test('past --max-parked-sessions the session parked longest is evicted: that client reports restarted (evicted), the other resumes', () => seeded(async () => {
    const server = await startServer({ args: ['--max-parked-sessions', '1'] });
    const proxies = [await new CuttingProxy(server.port, { seed }).listen(), await new CuttingProxy(server.port, { seed }).listen()];
    const [older, newer] = [await connect('tcp', proxies[0].port), await connect('tcp', proxies[1].port)];
    for (const [i, client] of [older, newer].entries()) {
      const reconnecting = nextEvent(client, 'state', (state) => state === 'reconnecting');
      proxies[i].blocked = true;
      proxies[i].cutAll();  // one at a time, so that the older one is parked first
      await within(30_000, 'reconnecting', reconnecting);
      await sleep(100);
    }
    const outcomes = [nextEvent(older, 'restarted'), nextEvent(newer, 'resumed')];
    for (const proxy of proxies) proxy.blocked = false;
    const [report] = await within(30_000, 'the outcomes', Promise.all(outcomes));
    assert.equal(report.reason, 'evicted');
    assert.equal(newer.reports.restarted.length, 0);
  }));

  test('an unknown token gets cannot_resume (unknown), one of a process that is gone (restarted); the connection may ask for a new session', async () => {
    const server = await startServer();
    const made = await rawHello(server.port, { session: {} });
    const { token } = json(made.answer).session;
    made.socket.close();
    const wrongSecret = token.slice(0, 40) + (token[40] === 'A' ? 'B' : 'A') + token.slice(41);
    for (const [presented, reason] of [[wrongSecret, 'unknown'], ['not a token', 'unknown'], ['A'.repeat(43), 'restarted']]) {
      const { socket, answer } = await rawHello(server.port, { session: { token: presented, position: 0 } });
      assert.equal(answer.type, FrameType.ERROR);
      assert.equal(answer.id, 1);
      assert.deepEqual(json(answer), { code: 'cannot_resume', message: json(answer).message, details: { reason } }, presented);
      socket.close();
    }
    const { socket } = await rawHello(server.port, { session: { token: wrongSecret, position: 0 } });
    const welcome = nextFrame(socket);
    socket.send(encodeFrame({ type: FrameType.HELLO, id: 2, payload: new TextEncoder().encode('{"version":1,"session":{}}') }));
    const granted = json(await within(30_000, 'welcome', welcome));
    assert.equal(granted.session.resumed, false);
    socket.close();
  });

  test("another user's token is refused as unknown and leaves the session alone; the same user's takes it over (taken)", () => seeded(async () => {
    const sha = (text) => createHash('sha256').update(text).digest('hex');
    const config = join(mkdtempSync(join(tmpdir(), 'switchboard-js-')), 'config.json');
    writeFileSync(config, JSON.stringify({
      access: { users: [{ name: 'alice', tokenSha256: sha('alice-secret') }, { name: 'bob', tokenSha256: sha('bob-secret') }] },
    }));
    const server = await startServer({ args: ['--config', config] });
    const alice = await connect('tcp', server.port, { token: 'alice-secret' });
    const echo = new MethodChannel('switchboard/echo', alice);
    assert.equal(await echo.invokeMethod('echo', 1), 1);
    const { token } = alice.session;

    const bob = await rawHello(server.port, { token: 'bob-secret', session: { token, position: 0 } });
    assert.equal(json(bob.answer).code, 'cannot_resume');
    assert.equal(json(bob.answer).details.reason, 'unknown');
    bob.socket.close();
    assert.equal(await echo.invokeMethod('echo', 2), 2, "alice's session goes on");
    assert.equal(alice.reports.restarted.length, 0);

    const restarted = nextEvent(alice, 'restarted');
    const thief = await rawHello(server.port, { token: 'alice-secret', session: { token, position: 0 } });
    assert.equal(thief.answer.type, FrameType.WELCOME);
    assert.equal(json(thief.answer).session.resumed, true);
    const report = await within(30_000, 'restarted', restarted);
    assert.equal(report.reason, 'taken');
    assert.notEqual(alice.session.token, token);
    assert.equal(await echo.invokeMethod('echo', 3), 3);
    thief.socket.close();
  }));
});

describe('sessions and the rest of the client', { timeout: 60_000 }, () => {
  test('a server without sessions (--session-ttl 0) gives a plain connection', async () => {
    const server = await startServer({ args: ['--session-ttl', '0'] });
    const client = await connect('ws', server.port);
    assert.equal(client.session, null);
    assert.equal(await new MethodChannel('switchboard/echo', client).invokeMethod('echo', 'x'), 'x');
  });

  test('the session HELLO and its WELCOME are not counted; every later frame is, whole', async () => {
    const server = await startServer();
    const client = await connect('tcp', server.port);
    assert.equal(client.session.sent, 0);
    assert.equal(client.session.received, 0);
    const payload = new MethodChannel('switchboard/echo', client).codec.encodeMethodCall({ method: 'echo', args: 'abc' });
    await client.request('switchboard/echo', payload);
    const frame = encodeFrame({ type: FrameType.MESSAGE, id: 1, channel: 'switchboard/echo', payload });
    assert.equal(client.session.sent, frame.length);
    assert.ok(client.session.received > 12);
  });
});

/**
 * A scripted server behind the WebSocket interface: each connection the client opens is one instance,
 * the test reads what the client sent (`frames`, decoded; `sent`, the bytes) and writes frames to it.
 */
class ScriptedSocket extends EventTarget {
  static opened = [];
  static #connecting = [];
  binaryType = 'arraybuffer';
  readyState = 0;
  frames = [];
  sent = [];
  #waiters = [];

  constructor() {
    super();
    ScriptedSocket.opened.push(this);
    for (const wake of ScriptedSocket.#connecting.splice(0)) wake();
    queueMicrotask(() => {
      this.readyState = 1;
      this.dispatchEvent(new Event('open'));
    });
  }

  /** Resolves with the `n`th connection the client opened (from 0). */
  static async connection(n) {
    while (ScriptedSocket.opened.length <= n) await new Promise((wake) => ScriptedSocket.#connecting.push(wake));
    return ScriptedSocket.opened[n];
  }

  send(bytes) {
    this.sent.push(bytes);
    this.frames.push(decodeFrame(bytes.slice().buffer));
    for (const wake of this.#waiters.splice(0)) wake();
  }

  /** Resolves with the first frame sent from index `from` on that `accept` takes. */
  async sentFrame(accept, from = 0) {
    for (;;) {
      const found = this.frames.slice(from).find(accept);
      if (found) return found;
      await new Promise((wake) => this.#waiters.push(wake));
    }
  }

  close() {
    if (this.readyState >= 2) return;
    this.readyState = 3;
    this.dispatchEvent(new Event('close'));
  }

  /** Delivers a frame to the client; returns its size on the wire. */
  deliver(frame) {
    const bytes = encodeFrame(frame);
    this.dispatchEvent(new MessageEvent('message', { data: bytes.slice().buffer }));
    return bytes.length;
  }

  welcome(id, session) {
    const body = { version: 1, server: 'scripted', maxFrame: 1 << 24, heartbeatMs: 0, session };
    this.deliver({ type: FrameType.WELCOME, id, payload: new TextEncoder().encode(JSON.stringify(body)) });
  }
}

describe('sessions against a scripted server', { timeout: 60_000 }, () => {
  const granted = (more = {}) => ({ token: 'T'.repeat(43), resumed: false, position: 0, ttlMs: 60_000, ackBytes: 100, ackMs: 60_000, ...more });
  const jsonBytes = (value) => new TextEncoder().encode(JSON.stringify(value));
  const helloOf = (frame) => JSON.parse(new TextDecoder().decode(frame.payload));
  const isHello = (frame) => frame.type === FrameType.HELLO;
  const isCall = (frame) => frame.type === FrameType.MESSAGE && frame.id !== 0;

  /** A client with a session on a new scripted connection: `{client, socket}`. */
  async function scripted(options = {}) {
    const first = ScriptedSocket.opened.length;
    const connecting = SwitchboardClient.connect('scripted:', {
      session: true, WebSocket: ScriptedSocket, reconnect: { initialDelayMs: 1, maxDelayMs: 5 }, ...options,
    });
    const socket = await ScriptedSocket.connection(first);
    const hello = await socket.sentFrame(isHello);
    assert.deepEqual(helloOf(hello).session, {});
    socket.welcome(hello.id, granted());
    const client = await connecting;
    clients.add(client);
    return { client, socket, first };
  }

  test('POSITION acknowledges whole frames once ackBytes are received, and never for nothing new', async () => {
    const { client, socket } = await scripted();
    let received = 0;
    for (let i = 0; i < 9; i++) received += socket.deliver({ type: FrameType.PING, id: i, payload: Uint8Array.of(1, 2) });
    const position = await socket.sentFrame((frame) => frame.type === FrameType.POSITION);
    const acknowledged = Number(new DataView(position.payload.buffer, position.payload.byteOffset).getBigUint64(0));
    assert.ok(acknowledged >= 100 && acknowledged <= received && acknowledged % 14 === 0, `POSITION ${acknowledged}`);
    assert.equal(client.session.received, received);
    assert.equal(socket.frames.filter((frame) => frame.type === FrameType.POSITION).length, 1);
    assert.equal(client.session.sent, socket.frames.filter((frame) => frame.type === FrameType.PONG).length * 14, 'PONGs are in the stream');
  });

  test('past maxUnacknowledgedBytes the client holds frames back, in order, until the server acknowledges', async () => {
    const { client, socket } = await scripted({ session: { maxUnacknowledgedBytes: 100 } });
    const calls = Array.from({ length: 6 }, (_, i) => client.request('c', new Uint8Array(21).fill(i)));
    for (const call of calls) call.catch(() => {});  // the last two are never answered
    const written = () => socket.frames.filter(isCall);
    assert.equal(written().length, 2, 'two frames of 34 bytes fit in 100, three do not');
    assert.equal(client.session.unacknowledged, 68);
    assert.equal(client.session.held, 4);
    const payload = new Uint8Array(8);
    new DataView(payload.buffer).setBigUint64(0, 68n);
    socket.deliver({ type: FrameType.POSITION, payload });
    assert.equal(written().length, 4);
    assert.deepEqual(written().map((frame) => frame.payload[0]), [0, 1, 2, 3]);
    for (const frame of written()) socket.deliver({ type: FrameType.REPLY, id: frame.id, payload: frame.payload });
    assert.equal((await calls[3])[0], 3);
  });

  test('resuming: the HELLO names the received position and the client sends again exactly what the server missed', async () => {
    const { client, socket, first } = await scripted();
    const calls = [1, 2, 3].map((n) => client.request('c', Uint8Array.of(n)));
    const sizes = socket.sent.filter((bytes) => bytes[4] === FrameType.MESSAGE).map((bytes) => bytes.length);
    const [one] = socket.frames.filter(isCall);
    const received = socket.deliver({ type: FrameType.REPLY, id: one.id, payload: Uint8Array.of(10) });
    assert.equal(client.session.received, received);
    const resumed = nextEvent(client, 'resumed');
    socket.close();
    const again = await ScriptedSocket.connection(first + 1);
    const hello = await again.sentFrame(isHello);
    assert.deepEqual(helloOf(hello).session, { token: 'T'.repeat(43), position: received });
    assert.equal(again.frames.length, 1, 'nothing after a resuming HELLO until its answer');
    again.welcome(hello.id, granted({ resumed: true, position: sizes[0] }));  // the server had only the first call
    await resumed;
    assert.deepEqual(again.frames.filter(isCall).map((frame) => frame.payload[0]), [2, 3]);
    for (const frame of again.frames.filter(isCall)) again.deliver({ type: FrameType.REPLY, id: frame.id, payload: frame.payload });
    assert.deepEqual((await Promise.all(calls)).map((reply) => reply[0]), [10, 2, 3]);
  });

  /** A scripted client that resumed on its third connection, having given up its second with the resuming
   * HELLO unanswered (a cut before the WELCOME: the server may still read that HELLO): `{client, next, first}`. */
  async function resumedAfterAnUnansweredHello() {
    const { client, socket, first } = await scripted();
    socket.close();
    const unanswered = await ScriptedSocket.connection(first + 1);
    await unanswered.sentFrame(isHello);
    unanswered.close();
    const resumed = nextEvent(client, 'resumed');
    const next = await ScriptedSocket.connection(first + 2);
    next.welcome((await next.sentFrame(isHello)).id, granted({ resumed: true, position: 0 }));
    await resumed;
    return { client, next, first };
  }

  test("a late resuming HELLO of the client's own takes the session from its next connection: the client resumes again, not taken", async () => {
    const { client, next, first } = await resumedAfterAnUnansweredHello();
    const call = client.request('c', Uint8Array.of(7));
    let restarted = null;
    client.on('restarted', (report) => { restarted = report; });
    // The late HELLO reaches the server, which moves the session to that connection and tells this one.
    const resumedAgain = nextEvent(client, 'resumed');
    next.deliver({ type: FrameType.ERROR, id: 0, payload: jsonBytes({ code: 'session_taken', message: 'taken over' }) });
    next.close();
    const last = await ScriptedSocket.connection(first + 3);
    const hello = await last.sentFrame(isHello);
    assert.deepEqual(helloOf(hello).session, { token: 'T'.repeat(43), position: 0 });
    last.welcome(hello.id, granted({ resumed: true, position: 0 }));
    await resumedAgain;
    assert.equal(restarted, null);
    const [sent] = last.frames.filter(isCall);
    last.deliver({ type: FrameType.REPLY, id: sent.id, payload: Uint8Array.of(70) });
    assert.equal((await call)[0], 70);
  });

  test('a session_taken more than 10 s after the unanswered resume that might explain it is a theft: restarted (taken)', async () => {
    const { client, next, first } = await resumedAfterAnUnansweredHello();
    const restarted = nextEvent(client, 'restarted');
    const realNow = Date.now;
    Date.now = () => realNow() + 11_000;  // past the window in which a late HELLO of its own explains it
    try {
      next.deliver({ type: FrameType.ERROR, id: 0, payload: jsonBytes({ code: 'session_taken', message: 'taken over' }) });
      next.close();
      const last = await ScriptedSocket.connection(first + 3);
      const hello = await last.sentFrame(isHello);
      assert.deepEqual(helloOf(hello).session, {}, 'a new session, not a resume');
      last.welcome(hello.id, granted({ token: 'U'.repeat(43) }));
      assert.equal((await restarted).reason, 'taken');
    } finally {
      Date.now = realNow;
    }
  });

  test('a WELCOME without a session in answer to a resume: restarted (unsupported), written calls fail, streams listen again', async () => {
    const { client, socket, first } = await scripted();
    const stream = new EventChannel('t', client).receiveBroadcastStream();
    stream[Symbol.asyncIterator]();
    const listen = await socket.sentFrame(isCall);
    socket.deliver({ type: FrameType.REPLY, id: listen.id, payload: Uint8Array.of(0, 0) });
    const call = client.request('c', Uint8Array.of(1));
    const outcome = rejectsWithCode(call, 'session_lost');
    const restarted = nextEvent(client, 'restarted');
    socket.close();
    const later = client.request('c', Uint8Array.of(2));  // not written before the session was lost: goes on
    const again = await ScriptedSocket.connection(first + 1);
    again.welcome((await again.sentFrame(isHello)).id, undefined);
    const report = await restarted;
    assert.equal(report.reason, 'unsupported');
    assert.deepEqual(report.streams, ['t']);
    assert.equal(report.failed.length, 1);
    await outcome;
    assert.equal(client.session, null);
    const relisten = await again.sentFrame((frame) => isCall(frame) && frame.channel === 't');
    assert.ok(relisten);
    const resent = await again.sentFrame((frame) => isCall(frame) && frame.channel === 'c');
    assert.deepEqual(resent.payload, Uint8Array.of(2));
    again.deliver({ type: FrameType.REPLY, id: resent.id, payload: Uint8Array.of(5) });
    assert.deepEqual(await later, Uint8Array.of(5));
    await client.close();  // the scripted server answers no cancel
  });

  test('a resume from a position the client did not keep: it closes, falls back (position) and asks for a new session', async () => {
    const { client, socket, first } = await scripted();
    client.request('c', Uint8Array.of(1)).catch(() => {});
    const restarted = nextEvent(client, 'restarted');
    socket.close();
    const again = await ScriptedSocket.connection(first + 1);
    again.welcome((await again.sentFrame(isHello)).id, granted({ resumed: true, position: 3 }));
    assert.equal(again.readyState, 3, 'closed');
    const third = await ScriptedSocket.connection(first + 2);
    const hello = await third.sentFrame(isHello);
    assert.deepEqual(helloOf(hello).session, {});
    third.welcome(hello.id, granted({ token: 'U'.repeat(43) }));
    assert.equal((await restarted).reason, 'position');
    assert.equal(client.session.token, 'U'.repeat(43));
  });

  test('cannot_resume: the client asks for a new session on the same connection', async () => {
    const { client, socket, first } = await scripted();
    const restarted = nextEvent(client, 'restarted');
    socket.close();
    const again = await ScriptedSocket.connection(first + 1);
    const hello = await again.sentFrame(isHello);
    again.deliver({ type: FrameType.ERROR, id: hello.id, payload: jsonBytes({ code: 'cannot_resume', message: 'session expired', details: { reason: 'expired' } }) });
    const second = await again.sentFrame((frame) => isHello(frame) && frame !== hello);
    assert.deepEqual(helloOf(second).session, {});
    again.welcome(second.id, granted({ token: 'V'.repeat(43) }));
    assert.equal((await restarted).reason, 'expired');
    assert.equal(ScriptedSocket.opened.length, first + 2, 'no other connection');
  });

  test('END from the server: ended (with the streams), the connection goes on without a session', async () => {
    const { client, socket } = await scripted();
    const stream = new EventChannel('t', client).receiveBroadcastStream();
    stream[Symbol.asyncIterator]();
    const listen = await socket.sentFrame(isCall);
    socket.deliver({ type: FrameType.REPLY, id: listen.id, payload: Uint8Array.of(0, 0) });
    const ended = nextEvent(client, 'ended');
    socket.deliver({ type: FrameType.END, payload: jsonBytes({ reason: 'overflowed' }) });
    assert.deepEqual(await ended, { reason: 'overflowed', streams: ['t'] });
    assert.equal(client.session, null);
    const call = client.request('c', Uint8Array.of(1));
    const frame = await socket.sentFrame((f) => isCall(f) && f.channel === 'c');
    for (let i = 0; i < 20; i++) socket.deliver({ type: FrameType.PING, id: i });
    socket.deliver({ type: FrameType.REPLY, id: frame.id, payload: Uint8Array.of(7) });
    assert.deepEqual(await call, Uint8Array.of(7));
    assert.equal(socket.frames.filter((f) => f.type === FrameType.POSITION).length, 0, 'no POSITION after END');
    await client.close();  // the scripted server answers no cancel
  });

  test('close() ends the session with END', async () => {
    const { client, socket } = await scripted();
    await client.close();
    assert.equal(socket.frames.at(-1).type, FrameType.END);
    assert.equal(socket.frames.at(-1).payload, null);
  });
});
