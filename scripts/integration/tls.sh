#!/usr/bin/env bash
# TLS on its own port, driven as a user would: `openssl s_client -quiet` is the nc of TLS (text and
# binary mode), the CLI's --tls, mutual TLS with access control by certificate subject, and the clean
# failures: a plain-text client, a stalled handshake, a peer that stops in the middle of a record, a
# client without a certificate or with one from another CA. Each is counted in stats' closes.
source "$(dirname "$0")/lib.bash"
CERTS=$(mktemp -d)
CONFIG=$(mktemp --suffix .json)
trap 'stop_server; rm -rf "$LOG" "$CERTS" "$CONFIG"' EXIT
"$(dirname "$0")/../make-test-certs" "$CERTS"

# start_tls [serve options…]: a server with TLS on a free port; sets PORT and TLS_PORT.
start_tls() {
    start_server --tls-cert "$CERTS/server.pem" --tls-key "$CERTS/server.key" --tls-port 0 --tls-handshake-timeout 300 "$@"
    TLS_PORT=$(logged_port "listening for TLS on") || exit 1
}

# tls_session NAME INPUT EXPECTED [openssl options…]: INPUT (printf format) through openssl s_client.
tls_session() {
    local name=$1 input=$2 expected=$3; shift 3
    local actual
    actual=$( { printf "$input"; sleep 0.3; } | timeout 10 openssl s_client -quiet -connect "127.0.0.1:$TLS_PORT" \
        -CAfile "$CERTS/ca.pem" -verify_return_error "$@" 2>/dev/null || true)
    check "$name" "$expected" "$actual"
}

closes() { "$SWITCHBOARD" call switchboard/stats get --port "$PORT" | python3 -c 'import json,sys; print(json.dumps(json.load(sys.stdin)["closes"], sort_keys=True))'; }

start_tls
tls_session "text mode over TLS" '{"id":1,"call":"switchboard/echo","method":"echo","args":"sealed"}\n' '{"id":1,"result":"sealed"}'
# A binary echo("hi") call on switchboard/echo, as binary-protocol.sh spells it out, and its reply.
actual=$( { printf '%s' "00000022 03 00 0010 00000001 $(hex_of switchboard/echo) 07 04 6563686f 07 02 6869" | tr -d ' ' | xxd -r -p; sleep 0.3; } \
    | timeout 10 openssl s_client -quiet -connect "127.0.0.1:$TLS_PORT" -CAfile "$CERTS/ca.pem" 2>/dev/null | xxd -p | tr -d '\n' || true)
check "binary mode over TLS" "0000000d04000000000000010007026869" "$actual"
check "the CLI with --tls" '"cli"' "$("$SWITCHBOARD" call switchboard/echo echo '"cli"' --port "$TLS_PORT" --tls --ca "$CERTS/ca.pem" --server-name localhost)"
check "a plain-text client on the TLS port is closed unanswered" "" \
    "$(printf '{"id":1,"call":"switchboard/echo","method":"echo"}\n' | timeout 5 nc 127.0.0.1 "$TLS_PORT" || true)"
started=$(date +%s%N)
check "a stalled handshake is closed after --tls-handshake-timeout" "" "$(timeout 5 nc -d 127.0.0.1 "$TLS_PORT" || true)"
elapsed=$(( ($(date +%s%N) - started) / 1000000 ))
check "… within a second, not at nc's end ($elapsed ms)" "yes" "$([ "$elapsed" -lt 1500 ] && echo yes || echo no)"
check "a peer that stops mid-record: its whole record is answered, then the connection closes" '{"id":1,"result":"ok"}' \
    "$(python3 - "$TLS_PORT" "$CERTS/ca.pem" <<'PY'
import socket, ssl, sys, time
port, ca = int(sys.argv[1]), sys.argv[2]
sock = socket.create_connection(("127.0.0.1", port))
incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
tls = ssl.create_default_context(cafile=ca).wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
while True:
    try:
        tls.do_handshake()
        break
    except ssl.SSLWantReadError:
        sock.sendall(outgoing.read())
        incoming.write(sock.recv(65536))
sock.sendall(outgoing.read())
tls.write(b'{"id":1,"call":"switchboard/echo","method":"echo","args":"ok"}\n')
record = outgoing.read()
sock.sendall(record + record[: len(record) // 2])  # a whole record, then half of one
time.sleep(0.3)
sock.shutdown(socket.SHUT_WR)
answer = b""
while data := sock.recv(65536):
    incoming.write(data)
    try:
        answer += tls.read(65536)
    except ssl.SSLError:
        pass
print(answer.decode().strip())
PY
)"
check "each failure counted by reason" '{"peerClosed": 3, "tlsError": 1, "tlsHandshakeFailed": 1, "tlsHandshakeTimeout": 1}' "$(closes)"
stop_server

# Mutual TLS: alice's certificate is her identity for access control; anonymous connections may read stats only.
cat >"$CONFIG" <<JSON
{"access": {"users": [{"name": "alice", "certificateSubject": "CN=alice,O=Switchboard Tests", "allow": {"call": ["switchboard/*"]}}],
            "anonymous": {"allow": {"call": ["switchboard/stats"], "listen": [], "send": [], "register": []}}}}
JSON
start_tls --tls-ca "$CERTS/ca.pem" --config "$CONFIG"
tls_session "mutual TLS: alice's certificate is her identity" '{"id":1,"call":"switchboard/echo","method":"echo","args":"alice"}\n' \
    '{"id":1,"result":"alice"}' -cert "$CERTS/alice.pem" -key "$CERTS/alice.key"
tls_session "mutual TLS: no certificate, no connection" '{"id":1,"call":"switchboard/echo","method":"echo"}\n' ''
tls_session "mutual TLS: a certificate from another CA, no connection" '{"id":1,"call":"switchboard/echo","method":"echo"}\n' '' \
    -cert "$CERTS/mallory.pem" -key "$CERTS/mallory.key"
text_session "the plain port: anonymous, so forbidden" '{"id":1,"call":"switchboard/echo","method":"echo"}\n' \
    '{"id":1,"error":{"code":"forbidden","message":"anonymous connections may not call on switchboard/echo"}}'
check "refused certificates counted" '2' "$(closes | python3 -c 'import json,sys; print(json.load(sys.stdin)["tlsHandshakeFailed"])')"
finish
