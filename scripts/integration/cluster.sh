#!/usr/bin/env bash
# Two nodes over a nats-server, driven with nc as the README's "Scaling" walk-through does: a post to the
# room on one node reaches a listener on the other; stats show the bus.
source "$(dirname "$0")/lib.bash"
NATS=$(command -v nats-server || true)
[ -n "$NATS" ] || { echo "FAIL nats-server is not installed (scripts/setup installs it): the cluster is untested"; exit 1; }
NATS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$NATS" -a 127.0.0.1 -p "$NATS_PORT" >/dev/null 2>&1 &
NATS_PID=$!
trap 'stop_server; kill "$NODE_B" "$NATS_PID" 2>/dev/null; wait 2>/dev/null; rm -f "$LOG" "$LOG_B"' EXIT
for _ in $(seq 1 100); do nc -z 127.0.0.1 "$NATS_PORT" 2>/dev/null && break; sleep 0.05; done

start_server --cluster "nats://127.0.0.1:$NATS_PORT" --node a
PORT_A=$PORT
LOG_B=$(mktemp)
"$SWITCHBOARD" serve --port 0 --log-level notice --cluster "nats://127.0.0.1:$NATS_PORT" --node b 2>"$LOG_B" &
NODE_B=$!
for _ in $(seq 1 100); do PORT_B=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$LOG_B"); [ -n "$PORT_B" ] && break; sleep 0.05; done
for log in "$LOG" "$LOG_B"; do
    for _ in $(seq 1 100); do grep -q "cluster bus connected" "$log" && break; sleep 0.05; done
done

# b joins the room; a posts until the first post arrives (b's subscription reaching NATS takes a moment).
ROOM=$(mktemp)
{ printf '{"id":1,"listen":"switchboard/room"}\n'; sleep 4; } | timeout 6 nc -N 127.0.0.1 "$PORT_B" >"$ROOM" &
LISTENER=$!
for _ in $(seq 1 40); do
    printf '{"id":7,"send":"switchboard/room.post","message":"hi all"}\n' | timeout 2 nc -N 127.0.0.1 "$PORT_A" >/dev/null
    grep -q '"event"' "$ROOM" && break
    sleep 0.1
done
printf '{"id":8,"send":"switchboard/room.post","message":"bye"}\n' | timeout 2 nc -N 127.0.0.1 "$PORT_A" >/dev/null
sleep 0.3
check "a post on node a reaches a listener on node b" \
'{"id":1,"result":null}
{"event":"switchboard/room","data":[104,105,32,97,108,108]}
{"event":"switchboard/room","data":[98,121,101]}' "$(awk '!/104,105,32/ || !seen++' "$ROOM" | head -3)"
kill "$LISTENER" 2>/dev/null || true
rm -f "$ROOM"

STATS=$(printf '{"id":9,"call":"switchboard/stats","method":"get"}\n' | timeout 5 nc -N 127.0.0.1 "$PORT_A")
check "node a's stats show the bus" 'a True' \
    "$(python3 -c 'import json,sys; c=json.loads(sys.argv[1])["result"]["cluster"]; print(c["node"], c["connected"] and c["eventsOut"] >= 2)' "$STATS")"
finish
