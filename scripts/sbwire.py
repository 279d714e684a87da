"""Just enough of Switchboard's wire protocol for scripts/soak.py and scripts/attacks.py (standard library only).

Frames (protocol/wire.md): a 12-byte big-endian header (length, type, flags, chanlen, id), the channel
name, the payload. Payloads: the StandardMessageCodec / StandardMethodCodec subset of protocol/codecs.md.
"""
import asyncio
import json
import socket
import statistics
import struct
import sys
import time

HELLO, WELCOME, MESSAGE, REPLY, PING, PONG, ERROR, GOAWAY, REGISTER, UNREGISTER, CANCEL, DEMAND = range(1, 13)
POSITION, END = 13, 14  # protocol/resumption.md: only on a connection with a session
NULL_PAYLOAD = 1
TYPE_NAMES = {1: "HELLO", 2: "WELCOME", 3: "MESSAGE", 4: "REPLY", 5: "PING", 6: "PONG", 7: "ERROR",
              8: "GOAWAY", 9: "REGISTER", 10: "UNREGISTER", 11: "CANCEL", 12: "DEMAND", 13: "POSITION", 14: "END"}
HEADER = struct.Struct(">IBBHI")

ECHO = "switchboard/echo"
ROOM = "switchboard/room"
ROOM_POST = "switchboard/room.post"
STATS = "switchboard/stats"


def frame(kind, fid=0, channel="", payload=None):
    """One binary frame; payload None means NULL_PAYLOAD."""
    ch = channel.encode() if isinstance(channel, str) else channel
    body = b"" if payload is None else payload
    return HEADER.pack(8 + len(ch) + len(body), kind, NULL_PAYLOAD if payload is None else 0, len(ch), fid) + ch + body


# ---- StandardMessageCodec (the subset: null, bool, int32/int64, float64, string, Uint8List, list, map)

class Int64(int):
    """An int that must be written as int64 even when it fits in 32 bits (decode keeps the distinction)."""


def _size(out, n):
    if n < 254:
        out.append(n)
    elif n <= 0xFFFF:
        out.append(254)
        out += struct.pack("<H", n)
    else:
        out.append(255)
        out += struct.pack("<I", n)


def _write(out, v):
    if v is None:
        out.append(0)
    elif v is True:
        out.append(1)
    elif v is False:
        out.append(2)
    elif isinstance(v, int):
        if not isinstance(v, Int64) and -2**31 <= v < 2**31:
            out.append(3)
            out += struct.pack("<i", v)
        else:
            out.append(4)
            out += struct.pack("<q", v)
    elif isinstance(v, float):
        out.append(6)
        out += bytes(-len(out) % 8)  # padding counted from the first byte of the whole payload
        out += struct.pack("<d", v)
    elif isinstance(v, str):
        b = v.encode()
        out.append(7)
        _size(out, len(b))
        out += b
    elif isinstance(v, (bytes, bytearray)):
        out.append(8)
        _size(out, len(v))
        out += v
    elif isinstance(v, list):
        out.append(12)
        _size(out, len(v))
        for item in v:
            _write(out, item)
    elif isinstance(v, dict):
        out.append(13)
        _size(out, len(v))
        for k, item in v.items():
            _write(out, k)
            _write(out, item)
    else:
        raise TypeError(f"cannot encode {type(v).__name__}")


def encode(*values, prefix=b""):
    """The payload `prefix` followed by `values`, padding counted from the start of the payload."""
    out = bytearray(prefix)
    for v in values:
        _write(out, v)
    return bytes(out)


def method_call(method, args=None):
    return encode(method, args)


def success(value):
    return encode(value, prefix=b"\x00")


def _read_size(b, i):
    n = b[i]
    if n < 254:
        return n, i + 1
    if n == 254:
        return struct.unpack_from("<H", b, i + 1)[0], i + 3
    return struct.unpack_from("<I", b, i + 1)[0], i + 5


def decode_value(b, i=0):
    """(value, next index); alignment is relative to index 0 of `b`, which must be the whole payload."""
    t = b[i]
    i += 1
    if t == 0:
        return None, i
    if t == 1:
        return True, i
    if t == 2:
        return False, i
    if t == 3:
        return struct.unpack_from("<i", b, i)[0], i + 4
    if t == 4:
        return Int64(struct.unpack_from("<q", b, i)[0]), i + 8
    if t == 6:
        i += -i % 8
        return struct.unpack_from("<d", b, i)[0], i + 8
    if t in (5, 7, 8):
        n, i = _read_size(b, i)
        raw = bytes(b[i:i + n])
        return (raw if t == 8 else raw.decode()), i + n
    if t == 12:
        n, i = _read_size(b, i)
        items = []
        for _ in range(n):
            v, i = decode_value(b, i)
            items.append(v)
        return items, i
    if t == 13:
        n, i = _read_size(b, i)
        m = {}
        for _ in range(n):
            k, i = decode_value(b, i)
            v, i = decode_value(b, i)
            m[k] = v
        return m, i
    raise ValueError(f"unsupported standard type {t}")


def decode_envelope(b):
    """('ok', value) or ('error', code, message, details)."""
    if b[0] == 0:
        v, _ = decode_value(b, 1)
        return ("ok", v)
    code, i = decode_value(b, 1)
    msg, i = decode_value(b, i)
    details, i = decode_value(b, i)
    return ("error", code, msg, details)


def hello_payload(**fields):
    """A HELLO's JSON payload: version 1 and `fields` (e.g. token=…, session={})."""
    return json.dumps({"version": 1, **fields}).encode()


def position_frame(position):
    """POSITION (protocol/resumption.md): the sender's received position, a big-endian u64."""
    return frame(POSITION, 0, "", struct.pack(">Q", position))


def json_of(payload):
    """A WELCOME's or an ERROR's JSON payload as a dict ({} when it is not one)."""
    try:
        value = json.loads(payload or b"{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def error_code(payload):
    try:
        return json.loads(payload or b"{}").get("code", "?")
    except ValueError:
        return "?"


# ---- framing over asyncio

class FrameParser:
    """Incremental frame parser: feed(bytes) then take frames (kind, flags, id, channel, payload|None)."""

    def __init__(self):
        self.buf = bytearray()

    def feed(self, data):
        self.buf += data
        frames = []
        buf = self.buf
        pos = 0
        n = len(buf)
        while n - pos >= 12:
            length, kind, flags, clen, fid = HEADER.unpack_from(buf, pos)
            end = pos + 4 + length
            if end > n:
                break
            ch = bytes(buf[pos + 12:pos + 12 + clen]).decode() if clen else ""
            payload = None if flags & NULL_PAYLOAD else bytes(buf[pos + 12 + clen:end])
            frames.append((kind, flags, fid, ch, payload))
            pos = end
        if pos:
            del buf[:pos]
        return frames


class FrameConnection(asyncio.Protocol):
    """A binary connection: on_frame is called for every frame; send() writes; requests() tracks answers.

    Every request (MESSAGE/REGISTER/HELLO with id != 0) is kept until exactly one REPLY, ERROR or WELCOME
    with its id arrives; an answer for an id that is not pending is recorded in `unexpected` (a duplicate
    or a stray).
    """

    def __init__(self, on_frame=None, name="conn"):
        self.name = name
        self.parser = FrameParser()
        self.transport = None
        self.pending = {}  # id -> (future, extra)
        self.next_id = 0
        self.unexpected = []  # (kind, id, payload) answers that matched nothing pending
        self.on_frame_cb = on_frame
        self.closed = asyncio.get_running_loop().create_future()
        self.errors = []  # ERROR frames with id 0 (connection-level)
        self.answers = 0

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        for f in self.parser.feed(data):
            kind, flags, fid, ch, payload = f
            if kind in (REPLY, ERROR, WELCOME) and fid != 0:
                entry = self.pending.pop(fid, None)
                if entry is None:
                    self.unexpected.append((kind, fid, payload))
                else:
                    self.answers += 1
                    if not entry.done():
                        entry.set_result((kind, payload))
                continue
            if kind == ERROR:
                self.errors.append(error_code(payload))
            if kind == PING:
                self.send(frame(PONG, fid, "", payload))
                continue
            if self.on_frame_cb:
                self.on_frame_cb(self, f)

    def connection_lost(self, exc):
        if not self.closed.done():
            self.closed.set_result(exc)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"{self.name}: connection lost with the request pending"))

    def send(self, data):
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def request(self, kind, channel, payload):
        """Sends a request with a fresh id; returns (id, future of (kind, payload))."""
        self.next_id = self.next_id % 0xFFFFFFFF + 1
        fid = self.next_id
        fut = asyncio.get_running_loop().create_future()
        self.pending[fid] = fut
        self.send(frame(kind, fid, channel, payload))
        return fid, fut

    async def call(self, channel, payload, kind=MESSAGE):
        _, fut = self.request(kind, channel, payload)
        return await fut

    def close(self):
        if self.transport is not None:
            self.transport.close()

    def abort(self):
        if self.transport is not None:
            self.transport.abort()


async def connect(port, on_frame=None, name="conn", rcvbuf=None):
    loop = asyncio.get_running_loop()
    if rcvbuf:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        _, proto = await loop.create_connection(lambda: FrameConnection(on_frame, name), sock=sock)
    else:
        _, proto = await loop.create_connection(lambda: FrameConnection(on_frame, name), "127.0.0.1", port)
    return proto


async def get_stats(port, timeout=10):
    conn = await asyncio.wait_for(connect(port, name="stats"), timeout)
    try:
        kind, payload = await asyncio.wait_for(conn.call(STATS, method_call("get")), timeout)
        if kind != REPLY or payload is None:
            raise RuntimeError(f"stats: unexpected answer {TYPE_NAMES.get(kind)}")
        env = decode_envelope(payload)
        if env[0] != "ok":
            raise RuntimeError(f"stats: error envelope {env}")
        return env[1]
    finally:
        conn.close()


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def mib(kib):
    return kib / 1024.0


def percentile(values, p):
    if not values:
        return float("nan")
    s = sorted(values)
    k = min(len(s) - 1, max(0, int(round(p / 100.0 * (len(s) - 1)))))
    return s[k]


def total_dropped(stats):
    d = stats.get("eventsDropped") or {}
    return sum(d.values()) if isinstance(d, dict) else int(d)


async def echo_latency(port, count, interval, timeout=5.0):
    """`count` echo calls one at a time, `interval` s apart; returns (latencies in ms, failures)."""
    conn = await connect(port, name="probe")
    lat, failures = [], 0
    try:
        for n in range(count):
            args = {"probe": n, "pad": "x" * 16}
            sent = time.perf_counter()
            try:
                kind, payload = await asyncio.wait_for(conn.call(ECHO, method_call("echo", args)), timeout)
            except (asyncio.TimeoutError, ConnectionError):
                failures += 1
                if conn.closed.done():
                    break
                continue
            lat.append((time.perf_counter() - sent) * 1000.0)
            if kind != REPLY or payload != success(args):
                failures += 1
            await asyncio.sleep(interval)
    finally:
        conn.close()
    return lat, failures


def probe_main(argv):
    """`python3 sbwire.py probe PORT COUNT INTERVAL`: prints {"lat":[…],"failures":n} (run as its own process)."""
    port, count, interval = int(argv[0]), int(argv[1]), float(argv[2])
    lat, failures = asyncio.run(echo_latency(port, count, interval))
    print(json.dumps({"lat": lat, "failures": failures, "p50": statistics.median(lat) if lat else None}))


if __name__ == "__main__" and len(sys.argv) > 1 and sys.argv[1] == "probe":
    probe_main(sys.argv[2:])
