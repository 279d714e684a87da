// What the tests of the client share: servers they start (the binary from $SWITCHBOARD, default: the
// repository's debug build), and waiting with a bound.
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { PlatformException } from '../client.js';

const binary = process.env.SWITCHBOARD ?? fileURLToPath(new URL('../../../.build/debug/switchboard', import.meta.url));
const servers = new Set();

/** Starts `switchboard serve` and resolves once it listens: `{process, port, url, exited}`. */
export function startServer({ port = 0, args = [] } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(binary, ['serve', '--port', String(port), '--log-level', 'notice', ...args], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    const server = { process: child, exited: new Promise((done) => child.on('exit', (code, signal) => done({ code, signal }))) };
    servers.add(server);
    server.exited.then(() => servers.delete(server));
    let log = '';
    const timer = setTimeout(() => reject(new Error(`the server did not start within 30 s:\n${log}`)), 30_000);
    child.on('error', reject);
    child.stderr.setEncoding('utf8');
    child.stderr.on('data', (chunk) => {
      log += chunk;
      const match = /listening on 127\.0\.0\.1:(\d+)/.exec(log);
      if (match && !server.port) {
        clearTimeout(timer);
        server.port = Number(match[1]);
        server.url = `ws://127.0.0.1:${server.port}/`;
        resolve(server);
      }
    });
    server.exited.then(({ code }) => { clearTimeout(timer); reject(new Error(`the server exited with ${code}:\n${log}`)); });
  });
}

/** Kills every server the tests started. */
export function stopServers() {
  for (const server of servers) server.process.kill('SIGKILL');
}

/** Resolves with `promise`, or rejects after `ms` naming `what`. */
export function within(ms, what, promise) {
  let timer;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what}: nothing within ${ms} ms`)), ms); }),
  ]);
}

export const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** Resolves with the first value `emitter` sends for `event` that `accept` takes. */
export function nextEvent(client, event, accept = () => true) {
  return new Promise((resolve) => {
    const stop = client.on(event, (value) => {
      if (accept(value)) { stop(); resolve(value); }
    });
  });
}

/** Asserts that `promise` rejects with a PlatformException of `code` (and `message`, when given). */
export async function rejectsWithCode(promise, code, message) {
  await assert.rejects(promise, (error) => {
    assert.ok(error instanceof PlatformException, `expected a PlatformException, got ${error}`);
    assert.equal(error.code, code);
    if (message !== undefined) assert.equal(error.message, message);
    return true;
  });
}

/** Starts a server on `port`, retrying while the port is still held by the one that died. */
export async function startWithRetry(port) {
  for (let attempt = 0; ; attempt++) {
    try {
      return await startServer({ port });
    } catch (error) {
      if (attempt >= 20) throw error;
      await sleep(250);
    }
  }
}
