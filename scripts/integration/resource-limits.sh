#!/usr/bin/env bash
# Running out of file descriptors: connections past the limit are shed at once (libuv's reserve-descriptor
# trick accepts and closes them, so clients see a closed connection rather than a hang), the ones the
# server holds keep working, and it accepts again once descriptors are free. Accept errors libuv does
# report are counted in stats (`acceptErrors`) and logged.
source "$(dirname "$0")/lib.bash"

ulimit -Sn 64  # the server gets 64 descriptors: the loop, the listener and stdio take some
start_server
ulimit -Sn 1024

outcome=$(python3 - "$PORT" <<'PY'
import socket, sys
port = int(sys.argv[1])
sockets = []
for _ in range(100):
    try:
        sockets.append(socket.create_connection(("127.0.0.1", port), timeout=2))
    except OSError:
        pass
served = shed = 0
for s in sockets:
    s.settimeout(2)
    try:
        s.sendall(b'{"id":1,"ping":true}\n')
        line = s.recv(100)
    except OSError:
        line = b""
    if line.startswith(b'{"id":1,"pong":true}'):
        served += 1
    elif line == b"":
        shed += 1
print("served" if served > 0 else "none served", "shed" if shed > 0 else "none shed",
      "all answered" if served + shed == len(sockets) == 100 else f"{served}+{shed} of {len(sockets)}")
PY
)
check "past the descriptor limit: some served, the rest shed, none hanging" "served shed all answered" "$outcome"
# The server gives back the storm's places as it reads their closes: within two seconds, one is served.
after=""
for _ in $(seq 20); do
    after=$(printf '{"id":1,"ping":true}\n' | timeout 2 nc -N 127.0.0.1 "$PORT" || true)
    [ "$after" == '{"id":1,"pong":true}' ] && break
    sleep 0.1
done
check "a connection after the storm is served" '{"id":1,"pong":true}' "$after"
finish
