// The client against a real server: the binary from $SWITCHBOARD (default: the repository's debug build).
import { test, describe, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  SwitchboardClient, MethodChannel, EventChannel, BasicMessageChannel, StandardMessageCodec, StringCodec,
  BinaryCodec, JSONMethodCodec, Float64, PlatformException, MissingPluginException, FormatError, FrameType,
  encodeFrame, decodeFrame,
} from '../client.js';
import { startServer, stopServers, within, sleep, nextEvent, rejectsWithCode, startWithRetry } from './helpers.js';

const clients = new Set();

async function connect(server, options = {}) {
  const client = await SwitchboardClient.connect(server.url, { name: 'js-test', ...options });
  clients.add(client);
  return client;
}

after(async () => {
  await Promise.all([...clients].map((client) => client.close()));
  stopServers();
});

describe('frames', () => {
  test('a payload may be any bytes: an ArrayBuffer or a view frames as its Uint8Array does', () => {
    const bytes = Uint8Array.of(0, 1, 2, 3, 4, 5, 6, 7);
    const expected = encodeFrame({ type: FrameType.MESSAGE, id: 9, channel: 'c', payload: bytes.subarray(2, 6) });
    assert.deepEqual(decodeFrame(expected.buffer).payload, Uint8Array.of(2, 3, 4, 5));
    for (const payload of [bytes.buffer.slice(2, 6), new DataView(bytes.buffer, 2, 4), new Uint16Array(bytes.buffer, 2, 2)]) {
      assert.deepEqual(encodeFrame({ type: FrameType.MESSAGE, id: 9, channel: 'c', payload }), expected);
    }
    assert.throws(() => encodeFrame({ type: FrameType.MESSAGE, id: 9, channel: 'c', payload: [1, 2] }), FormatError);
  });

  test('a channel name over 65535 UTF-8 bytes is refused rather than framed with a wrong length', () => {
    assert.equal(encodeFrame({ type: FrameType.DEMAND, channel: 'é'.repeat(32767) }).length, 12 + 65534);
    assert.throws(() => encodeFrame({ type: FrameType.DEMAND, channel: 'é'.repeat(32768) }), FormatError);
  });
});

describe('against one server', { timeout: 120_000 }, () => {
  let server, client, echo;
  before(async () => {
    server = await startServer();
    client = await connect(server);
    echo = new MethodChannel('switchboard/echo', client);
  });

  test('HELLO is answered by WELCOME', () => {
    assert.equal(client.state, 'connected');
    assert.match(client.welcome.server, /^switchboard\//);
    assert.equal(client.welcome.maxFrame, 16 * 1024 * 1024);
    assert.equal(client.welcome.version, 1);
  });

  test('echo returns values of every type as they went', async () => {
    const values = [
      null, true, false, 0, -7, 2147483647, -2147483648, 1.5, -3.25, 'héllo ☺ 😀', '',
      Uint8Array.of(1, 2, 255), Int32Array.of(-1, 7), BigInt64Array.of(-(2n ** 63n), 5n), Float32Array.of(0.5, -2),
      Float64Array.of(Math.PI), [1, 'two', [null, [false]]], new Map([[1, 'one'], ['k', new Map()], [null, [1.5]]]),
      98742923489n, -1n,
    ];
    for (const value of values) assert.deepEqual(await echo.invokeMethod('echo', value), value, String(value));
    assert.equal(await echo.invokeMethod('echo', 2 ** 40), 2n ** 40n, 'an int64 comes back as a bigint');
    assert.equal(await echo.invokeMethod('echo', new Float64(2)), 2);
    assert.ok(Object.is(await echo.invokeMethod('echo', -0), -0));
    assert.ok(Number.isNaN(await echo.invokeMethod('echo', NaN)));
    assert.deepEqual(await echo.invokeMethod('echo', { a: 1, b: [true] }), new Map([['a', 1], ['b', [true]]]));
    const big = new Uint8Array(300_000).map((_, i) => i % 251);
    assert.deepEqual(await echo.invokeMethod('echo', big), big);
  });

  test('echo.json speaks JSONMethodCodec', async () => {
    const json = new MethodChannel('switchboard/echo.json', client, new JSONMethodCodec());
    assert.deepEqual(await json.invokeMethod('echo', { list: [1, 'x', null], n: 1234567890123456789n }),
      new Map([['list', [1, 'x', null]], ['n', 1234567890123456789n]]));
    await rejectsWithCode(json.invokeMethod('fail', [1]), 'demo_error', 'requested failure');
  });

  test('fail rejects with the PlatformException of the error envelope', async () => {
    await assert.rejects(echo.invokeMethod('fail', { why: [1, 2] }), (error) => {
      assert.ok(error instanceof PlatformException);
      assert.equal(error.code, 'demo_error');
      assert.equal(error.message, 'requested failure');
      assert.deepEqual(error.details, new Map([['why', [1, 2]]]));
      return true;
    });
  });

  test('an unknown method or a channel without a handler is a MissingPluginException', async () => {
    await assert.rejects(echo.invokeMethod('nope'), MissingPluginException);
    await assert.rejects(new MethodChannel('nobody/here', client).invokeMethod('x'), MissingPluginException);
  });

  test('a wire ERROR answering a request rejects with its code', async () => {
    const room = new BasicMessageChannel('switchboard/room.post', client, new BinaryCodec());
    await rejectsWithCode(room.send(null), 'bad_payload');
    await rejectsWithCode(client.request('switchboard/echo', Uint8Array.of(0xff)), 'bad_payload');
  });

  test('a frame larger than the server takes is refused locally', async () => {
    const bytes = new BasicMessageChannel('switchboard/message.binary', client, new BinaryCodec());
    await rejectsWithCode(bytes.send(new Uint8Array(client.welcome.maxFrame)), 'frame_too_large');
    assert.deepEqual(await bytes.send(Uint8Array.of(9)), Uint8Array.of(9), 'the connection goes on');
  });

  test('message channels: standard, string and binary codecs', async () => {
    const standard = new BasicMessageChannel('switchboard/message', client);
    const value = new Map([['n', 1], [2n, [new Float64(1), 'x']], ['bytes', Uint8Array.of(1)]]);
    assert.deepEqual(await standard.send(value), new Map([['n', 1], [2n, [1, 'x']], ['bytes', Uint8Array.of(1)]]));
    assert.equal(await standard.send(null), null);
    const strings = new BasicMessageChannel('switchboard/message.string', client, new StringCodec());
    assert.equal(await strings.send('grüß dich'), 'grüß dich');
    const bytes = new BasicMessageChannel('switchboard/message.binary', client, new BinaryCodec());
    assert.deepEqual(await bytes.send(Uint8Array.of(0, 1, 254)), Uint8Array.of(0, 1, 254));
    assert.deepEqual(await bytes.send(new Uint8Array()), new Uint8Array());
    assert.equal(await bytes.send(null), null);
  });

  test('a ticker stream yields its values, then ends', async () => {
    const ticker = new EventChannel('switchboard/ticker', client);
    const values = [];
    for await (const value of ticker.receiveBroadcastStream({ count: 5, intervalMs: 0 })) values.push(value);
    assert.deepEqual(values, [0, 1, 2, 3, 4]);
  });

  test('a refused listen makes the iterator throw', async () => {
    const ticker = new EventChannel('switchboard/ticker', client);
    const stream = ticker.receiveBroadcastStream({ count: -1 });
    await rejectsWithCode((async () => { for await (const _ of stream) assert.fail('no event expected'); })(), 'bad_arguments');
    assert.equal(await stream.ready, false);
  });

  test('aborting a stream cancels it on the server', async () => {
    const ticker = new EventChannel('switchboard/ticker', client);
    const controller = new AbortController();
    const seen = [];
    await assert.rejects(within(30_000, 'abort', (async () => {
      for await (const value of ticker.receiveBroadcastStream({ intervalMs: 5 }, { signal: controller.signal })) {
        seen.push(value);
        if (seen.length === 3) controller.abort();
      }
    })()), { name: 'AbortError' });
    assert.deepEqual(seen, [0, 1, 2]);
    // The cancel went out before this call, so the server has no stream left on the channel.
    await rejectsWithCode(new MethodChannel('switchboard/ticker', client).invokeMethod('cancel'), 'error', 'No active stream to cancel');
    const stats = await new MethodChannel('switchboard/stats', client).invokeMethod('get');
    assert.ok(stats.get('connections') >= 1);
  });

  test('breaking out of a loop cancels the stream on the server', async () => {
    const ticker = new EventChannel('switchboard/ticker', client);
    const stream = ticker.receiveBroadcastStream({ intervalMs: 5 });
    for await (const value of stream) if (value === 2) break;
    await rejectsWithCode(new MethodChannel('switchboard/ticker', client).invokeMethod('cancel'), 'error', 'No active stream to cancel');
  });

  test('aborting a call rejects it with AbortError and leaves the connection usable', async () => {
    const aborted = AbortSignal.abort();
    await assert.rejects(echo.invokeMethod('echo', 1, { signal: aborted }), { name: 'AbortError' });
    const controller = new AbortController();
    const call = echo.invokeMethod('echo', 'late', { signal: controller.signal });
    controller.abort();
    await assert.rejects(call, { name: 'AbortError' });
    const results = await Promise.all([1, 2, 3].map((n) => echo.invokeMethod('echo', n)));
    assert.deepEqual(results, [1, 2, 3]);
  });

  test('with credit, a paused consumer gets no more events than granted', async () => {
    const ticker = new EventChannel('switchboard/ticker', client);
    const stream = ticker.receiveBroadcastStream({ intervalMs: 0 }, { credit: 3 });
    const events = stream[Symbol.asyncIterator]();
    assert.deepEqual(await within(30_000, 'first event', events.next()), { value: 0, done: false });
    stream.pause();
    await sleep(1000);  // unpaced, the ticker would send thousands meanwhile
    assert.equal(stream.buffered, 2, 'the rest of the credit of 3');
    assert.deepEqual((await events.next()).value, 1);
    assert.deepEqual((await events.next()).value, 2);
    const third = events.next();
    const outcome = await Promise.race([third.then(() => 'event'), sleep(1000).then(() => 'nothing')]);
    assert.equal(outcome, 'nothing', 'no event while paused with no credit left');
    stream.resume();
    assert.deepEqual(await within(30_000, 'event after resume', third), { value: 3, done: false });
    await stream.cancel();
    assert.deepEqual(await events.next(), { value: undefined, done: true });
  });

  test('a second listen on a channel replaces the first: the old one is cancelled, none of its events reach the new one', async () => {
    const ticker = new EventChannel('switchboard/ticker', client);
    const old = ticker.receiveBroadcastStream({ intervalMs: 0 });
    await within(30_000, 'the old stream runs', old[Symbol.asyncIterator]().next());
    // The old stream's events are still arriving as the new listen goes out; the new stream must start at
    // 0, and its DEMAND must credit it rather than the old one (or it would be in push mode).
    const fresh = ticker.receiveBroadcastStream({ intervalMs: 0 }, { credit: 2 });
    const events = fresh[Symbol.asyncIterator]();
    assert.deepEqual(await within(30_000, 'first event', events.next()), { value: 0, done: false });
    fresh.pause();
    await sleep(500);
    assert.ok(fresh.buffered <= 2, `buffered ${fresh.buffered}: a credit of 2 holds at most 2 events not taken`);
    await fresh.cancel();
    await rejectsWithCode(new MethodChannel('switchboard/ticker', client).invokeMethod('cancel'), 'error', 'No active stream to cancel');
  });

  test('highWaterMark must be a count the wire can grant', () => {
    const ticker = new EventChannel('switchboard/ticker', client);
    for (const highWaterMark of [0, -1, 1.5, 2 ** 32, 'x']) {
      assert.throws(() => ticker.receiveBroadcastStream(null, { highWaterMark }), RangeError);
    }
  });

  test('a push stream whose consumer lags switches to credit and stops growing', async () => {
    const ticker = new EventChannel('switchboard/ticker', client);
    const stream = ticker.receiveBroadcastStream({ intervalMs: 1 }, { highWaterMark: 20 });
    const events = stream[Symbol.asyncIterator]();
    await within(30_000, 'first event', events.next());
    // What the server had sent before the DEMAND arrived (up to its outbound limit) still comes in;
    // then nothing more while the consumer takes nothing.
    let buffered = -1;
    for (let i = 0; i < 60 && stream.buffered !== buffered; i++) {
      buffered = stream.buffered;
      await sleep(500);
    }
    await sleep(1000);
    assert.equal(stream.buffered, buffered, 'nothing arrives while the buffer is over the high-water mark');
    assert.ok(buffered >= 20 && buffered < 1_000_000, `buffered ${buffered}`);
    let expected = 1;  // every event is delivered, in order, as the consumer catches up
    for (let i = 0; i < buffered + 50; i++) assert.equal((await events.next()).value, expected++);
    await stream.cancel();
  });

  test('a room post reaches every listener', async () => {
    const other = await connect(server);
    const streams = [client, other].map((c) => new EventChannel('switchboard/room', c).receiveBroadcastStream());
    const iterators = streams.map((s) => s[Symbol.asyncIterator]());
    const firsts = iterators.map((it) => it.next());
    assert.deepEqual(await within(30_000, 'listens', Promise.all(streams.map((s) => s.ready))), [true, true]);
    const post = new BasicMessageChannel('switchboard/room.post', other, new BinaryCodec());
    assert.equal(await post.send(Uint8Array.of(1, 2, 3)), null);
    for (const first of await within(30_000, 'room events', Promise.all(firsts))) {
      assert.deepEqual(first, { value: Uint8Array.of(1, 2, 3), done: false });
    }
    await Promise.all(streams.map((s) => s.cancel()));
    await other.close();
    assert.equal(other.state, 'closed');
    await rejectsWithCode(new MethodChannel('switchboard/echo', other).invokeMethod('echo', 1), 'closed');
  });
});

describe('connecting', { timeout: 120_000 }, () => {
  test('a token is required when the server has one; PINGs are answered', async () => {
    const server = await startServer({ args: ['--token', 'sesame', '--heartbeat', '200'] });
    await rejectsWithCode(SwitchboardClient.connect(server.url, { token: 'wrong' }), 'unauthorized');
    const client = await connect(server, { token: 'sesame' });
    await sleep(1500);  // several heartbeat intervals: without PONGs the server would close the connection
    assert.equal(client.state, 'connected');
    assert.equal(await new MethodChannel('switchboard/echo', client).invokeMethod('echo', 'still here'), 'still here');
  });

  test('without a global WebSocket (Node 20 without its flag), connecting names the flag rather than failing as a network error', async () => {
    const client = new URL('../client.js', import.meta.url).href;
    const script = `import { SwitchboardClient } from ${JSON.stringify(client)};
      try { await SwitchboardClient.connect('ws://127.0.0.1:9/'); console.log('connected'); }
      catch (e) { console.log(JSON.stringify({ name: e.name, code: e.code ?? null, message: e.message })); }`;
    const child = spawn(process.execPath, ['--no-experimental-websocket', '--input-type=module', '-e', script], { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    child.stdout.setEncoding('utf8').on('data', (chunk) => { out += chunk; });
    await within(30_000, 'node without WebSocket', new Promise((done) => child.on('exit', done)));
    const error = JSON.parse(out);
    assert.equal(error.name, 'TypeError');
    assert.equal(error.code, null, 'not a PlatformException: nothing was tried on the network');
    assert.match(error.message, /--experimental-websocket/);
    assert.match(error.message, /Node 22/);
    assert.match(error.message, /options\.WebSocket|WebSocket option/);
  });

  test('a server that is not there fails the connect', async () => {
    const server = await startServer();
    const { url } = server;
    server.process.kill('SIGKILL');
    await server.exited;
    await rejectsWithCode(SwitchboardClient.connect(url), 'connection_failed');
  });
});

describe('refusals', { timeout: 120_000 }, () => {
  test('forbidden and rate_limited reject with their code and the details (retryAfterMs); the connection goes on', async () => {
    const config = join(mkdtempSync(join(tmpdir(), 'switchboard-js-')), 'config.json');
    writeFileSync(config, JSON.stringify({
      access: { anonymous: { allow: { call: ['switchboard/echo'], listen: [], send: [], register: [] } } },
      rateLimits: [{ channels: ['switchboard/echo'], perConnection: { rate: 1, burst: 1 } }],
    }));
    const server = await startServer({ args: ['--config', config] });
    const client = await connect(server);
    const echo = new MethodChannel('switchboard/echo', client);
    await assert.rejects(new MethodChannel('switchboard/stats', client).invokeMethod('get'), (error) => {
      assert.ok(error instanceof PlatformException, `expected a PlatformException, got ${error}`);
      assert.equal(error.code, 'forbidden');
      assert.match(error.message, /may not call on switchboard\/stats/);
      return true;
    });
    assert.equal(await echo.invokeMethod('echo', 1), 1);
    await assert.rejects(echo.invokeMethod('echo', 2), (error) => {
      assert.ok(error instanceof PlatformException, `expected a PlatformException, got ${error}`);
      assert.equal(error.code, 'rate_limited');
      const retryAfterMs = error.details?.get('retryAfterMs');
      assert.ok(Number.isInteger(retryAfterMs) && retryAfterMs > 0 && retryAfterMs <= 1000, `details ${error.details}`);
      return true;
    });
    assert.equal(client.state, 'connected');
  });
});

describe('losing the server', { timeout: 180_000 }, () => {
  test('after a crash the client reconnects and listens again', async () => {
    const server = await startServer();
    const client = await connect(server, { reconnect: { initialDelayMs: 50, maxDelayMs: 500 } });
    const stream = new EventChannel('switchboard/ticker', client).receiveBroadcastStream({ intervalMs: 20 });
    const events = stream[Symbol.asyncIterator]();
    assert.equal((await within(30_000, 'event', events.next())).value, 0);
    assert.equal((await within(30_000, 'event', events.next())).value, 1);

    const reconnecting = nextEvent(client, 'state', (s) => s === 'reconnecting');
    const tickerMethods = new MethodChannel('switchboard/ticker', client);
    server.process.kill('SIGKILL');
    await server.exited;
    await within(30_000, 'reconnecting', reconnecting);
    await rejectsWithCode(tickerMethods.invokeMethod('cancel'), 'disconnected');

    const connected = nextEvent(client, 'state', (s) => s === 'connected');
    await startWithRetry(server.port);
    await within(60_000, 'reconnected', connected);
    // Events buffered before the crash come first; then the new stream starts again from 0.
    let value;
    do value = (await within(30_000, 'event after reconnecting', events.next())).value; while (value !== 0);
    assert.equal((await within(30_000, 'event', events.next())).value, 1);
    await stream.cancel();
    await client.close();
  });

  test('GOAWAY is surfaced; without reconnect the stream ends and the client closes', async () => {
    const server = await startServer();
    const client = await connect(server);
    const stream = new EventChannel('switchboard/ticker', client).receiveBroadcastStream({ intervalMs: 50 });
    const goaway = nextEvent(client, 'goaway');
    const closed = nextEvent(client, 'state', (s) => s === 'closed');
    const received = [];
    const loop = (async () => { for await (const value of stream) received.push(value); })();
    assert.equal(await within(30_000, 'listen', stream.ready), true);
    server.process.kill('SIGINT');
    assert.equal(typeof await within(30_000, 'goaway', goaway), 'string');
    await within(30_000, 'end of stream', loop);
    await within(30_000, 'closed', closed);
    assert.equal((await server.exited).code, 0);
    assert.ok(received.every((v, i) => v === i), 'events in order before the end');
  });
});
