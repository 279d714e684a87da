// wire-v1 binary frames over plain TCP for Node, behind the WebSocket interface the client uses:
// pass `WebSocket: TcpSocket` and a `tcp://HOST:PORT` URL to SwitchboardClient.connect.
import { connect } from 'node:net';

/** The most a frame's length field may say before the connection is dropped (the server's maxFrame is 16 MiB). */
const MAX_FRAME = 64 * 1024 * 1024;

/** A TCP connection that delivers one `message` event per frame (`data`: an ArrayBuffer of the whole frame). */
export class TcpSocket extends EventTarget {
  static CONNECTING = 0;
  static OPEN = 1;
  static CLOSING = 2;
  static CLOSED = 3;

  binaryType = 'arraybuffer';
  readyState = TcpSocket.CONNECTING;
  #socket;
  #input = Buffer.alloc(0);

  constructor(url) {
    super();
    const { protocol, hostname, port } = new URL(url);
    if (protocol !== 'tcp:') throw new TypeError(`a TcpSocket URL is tcp://HOST:PORT, not ${url}`);
    this.#socket = connect({ host: hostname.replace(/^\[|\]$/g, ''), port: Number(port) });
    this.#socket.setNoDelay(true);
    this.#socket.on('connect', () => {
      this.readyState = TcpSocket.OPEN;
      this.dispatchEvent(new Event('open'));
    });
    this.#socket.on('data', (chunk) => this.#read(chunk));
    this.#socket.on('error', () => this.dispatchEvent(new Event('error')));
    this.#socket.on('close', () => {
      this.readyState = TcpSocket.CLOSED;
      this.dispatchEvent(new Event('close'));
    });
  }

  send(bytes) {
    if (this.readyState === TcpSocket.OPEN) this.#socket.write(bytes);
  }

  /** Ends the connection (FIN); it is destroyed if the peer has not closed within a second. */
  close() {
    if (this.readyState >= TcpSocket.CLOSING) return;
    this.readyState = TcpSocket.CLOSING;
    this.#socket.end();
    setTimeout(() => this.#socket.destroy(), 1000).unref();
  }

  #read(chunk) {
    this.#input = this.#input.length === 0 ? chunk : Buffer.concat([this.#input, chunk]);
    while (this.#input.length >= 4) {
      const length = this.#input.readUInt32BE(0);
      if (length > MAX_FRAME) return void this.#socket.destroy();
      if (this.#input.length < 4 + length) return;
      const frame = this.#input.subarray(0, 4 + length);
      this.#input = this.#input.subarray(4 + length);
      const data = frame.buffer.slice(frame.byteOffset, frame.byteOffset + frame.length);
      if (this.readyState === TcpSocket.OPEN) this.dispatchEvent(new MessageEvent('message', { data }));
    }
  }
}
