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
    const todo = loops > 1 && transport === 'ws' ? 'a WebSocket resume landing on another loop is not served yet' : undefined;
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

      test('numbered events arrive gap-free and without duplicates, pushed or paced by credit', { todo }, () => seeded(async () => {
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

      test('calls in flight at a cut get exactly one real answer, and the holder runs each once', { todo }, () => seeded(async () => {
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

      test('a holder cut mid-request answers after resuming, and its callers get the answers', { todo }, () => seeded(async () => {
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

      test('a session parked past what it may keep is lost: the client reports restarted (overflowed) and listens again', { todo }, () => seeded(async () => {
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
