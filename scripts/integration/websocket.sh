#!/usr/bin/env bash
# WebSocket and HTTP as their real clients use them: Python's `websockets` (from PyPI, in .build/venv,
# installed by scripts/setup) for binary and text mode over ws:// and wss://, a stream, WebSocket pings
# keeping a heartbeat alive, close codes 1009 and 1008; curl for /healthz and 404; `--http off`.
source "$(dirname "$0")/lib.bash"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=$ROOT/.build/venv/bin/python
CERTS=$(mktemp -d)
trap 'stop_server; rm -rf "$LOG" "$CERTS"' EXIT
"$ROOT/scripts/make-test-certs" "$CERTS"

start_server --tls-cert "$CERTS/server.pem" --tls-key "$CERTS/server.key" --tls-port 0 --max-frame 4096 \
    --heartbeat 200 --ws-origin 'https://*.good.example'
TLS_PORT=$(logged_port "listening for TLS on") || exit 1

read -r -d '' CLIENT <<'PY' || true
import asyncio, json, ssl, struct, sys
import websockets
port, tls_port, ca = sys.argv[1:4]

def call(id, channel, method, arg):  # a wire-v1 MESSAGE frame; StandardMethodCodec strings
    def s(t): b = t.encode(); return bytes([7, len(b)]) + b
    payload = s(method) + s(arg)
    ch = channel.encode()
    return struct.pack(">IBBHI", 8 + len(ch) + len(payload), 3, 0, len(ch), id) + ch + payload

async def main():
    out = []
    async with websockets.connect(f"ws://127.0.0.1:{port}/", ping_interval=None) as w:
        await w.send(call(7, "switchboard/echo", "echo", "hi"))
        reply = await w.recv()
        length, kind, flags, chlen, id = struct.unpack(">IBBHI", reply[:12])
        out.append(f"binary: type {kind} id {id} whole {length + 4 == len(reply)} ends {reply[-2:]!r}")
    async with websockets.connect(f"ws://127.0.0.1:{port}/", ping_interval=None) as w:
        await w.send(json.dumps({"id": 1, "listen": "switchboard/ticker", "args": {"count": 2, "intervalMs": 10}}))
        out.append("text: " + " ".join([await w.recv() for _ in range(4)]))
    context = ssl.create_default_context(cafile=ca)
    async with websockets.connect(f"wss://127.0.0.1:{tls_port}/", ssl=context, ping_interval=0.05) as w:
        await asyncio.sleep(1)  # five heartbeat intervals with nothing but WebSocket pings
        await w.send(json.dumps({"id": 2, "call": "switchboard/echo", "method": "echo", "args": "over wss"}))
        out.append("wss, pinging: " + await w.recv())
    async with websockets.connect(f"ws://127.0.0.1:{port}/", ping_interval=None) as w:
        await w.send(call(3, "switchboard/echo", "echo", "then silence"))
        try:
            async with asyncio.timeout(2):
                while True:
                    await w.recv()  # the reply, then wire PINGs this client never answers
        except websockets.ConnectionClosed as e:
            out.append(f"silent: closed ({e.rcvd is not None})")
    async with websockets.connect(f"ws://127.0.0.1:{port}/", ping_interval=None, max_size=None) as w:
        await w.send(b"\0" * 10000)
        try:
            await w.recv()
        except websockets.ConnectionClosed as e:
            out.append(f"too large: {e.rcvd.code}")
    async with websockets.connect(f"ws://127.0.0.1:{port}/", origin="https://evil.example", ping_interval=None) as w:
        try:
            await w.recv()
        except websockets.ConnectionClosed as e:
            out.append(f"evil origin: {e.rcvd.code}")
    print("\n".join(out))

asyncio.run(main())
PY
read -r -d '' EXPECTED <<'TEXT' || true
binary: type 4 id 7 whole True ends b'hi'
text: {"id":1,"result":null} {"event":"switchboard/ticker","data":0} {"event":"switchboard/ticker","data":1} {"event":"switchboard/ticker","end":true}
wss, pinging: {"id":2,"result":"over wss"}
silent: closed (False)
too large: 1009
evil origin: 1008
TEXT
check "binary and text over ws:// and wss://, a stream, pings as heartbeat, close codes" "$EXPECTED" \
    "$(timeout 30 "$PYTHON" -c "$CLIENT" "$PORT" "$TLS_PORT" "$CERTS/ca.pem")"
GUIDE_SNIPPET=$(awk '/^## WebSocket/ {on=1} on && /^```python/ {grab=1; next} grab && /^```/ {exit} grab' "$ROOT/docs/tls-and-websocket.md")
check "the Python snippet of docs/tls-and-websocket.md" '{"id":1,"result":"hi"}' \
    "$(timeout 10 "$PYTHON" -c "${GUIDE_SNIPPET//127.0.0.1:7420/127.0.0.1:$PORT}")"
check "curl /healthz" '{"status":"serving"' "$(curl -s "http://127.0.0.1:$PORT/healthz" | cut -c1-19)"
check "curl /healthz over TLS" "200" "$(curl -s -o /dev/null -w '%{http_code}' --cacert "$CERTS/ca.pem" "https://127.0.0.1:$TLS_PORT/healthz")"
check "curl: anything else is 404" "404" "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/other")"
check "closes counted" '{"webSocketError": 1, "webSocketRefused": 1}' \
    "$("$SWITCHBOARD" call switchboard/stats get --port "$PORT" | python3 -c 'import json,sys; c=json.load(sys.stdin)["closes"]; print(json.dumps({k: v for k, v in sorted(c.items()) if k.startswith("webSocket")}))')"
stop_server

start_server --http off
check "--http off: /healthz is 404" "404" "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/healthz")"
finish
