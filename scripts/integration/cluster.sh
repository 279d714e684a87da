#!/usr/bin/env bash
# Two nodes over a nats-server, driven as the walk-through of docs/scaling-and-cluster.md does: a post to the room on
# one node reaches a listener on the other; the broker example holds channels on one node and the CLI
# and nc use them from the other; stats show the bus.
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

# The guide's broker walk-through: the example holds greeter/* on node a, node b's clients use them.
"$(dirname "$SWITCHBOARD")/broker-example" --port "$PORT_A" >/dev/null 2>&1 &
EXAMPLE=$!
trap 'stop_server; kill "$EXAMPLE" "$NODE_B" "$NATS_PID" 2>/dev/null; wait 2>/dev/null; rm -f "$LOG" "$LOG_B"' EXIT
for _ in $(seq 1 100); do  # until its registration has reached the nats-server
    [ "$("$SWITCHBOARD" call greeter/hello hello '"x"' --port "$PORT_B" 2>/dev/null)" = '"Hello, x!"' ] && break
    sleep 0.05
done
check "node b calls a channel held on node a" '"Hello, Ada!"' "$("$SWITCHBOARD" call greeter/hello hello '"Ada"' --port "$PORT_B")"
check "node b listens to an event channel held on node a" 2 \
    "$(timeout 10 "$SWITCHBOARD" listen greeter/clock --count 2 --port "$PORT_B" | grep -cE '^[0-9]{10}$')"
check "a text client of node b calls it" '{"id":1,"result":"Hello, nc!"}' \
    "$( { printf '{"id":1,"call":"greeter/hello","method":"hello","args":"nc"}\n'; sleep 0.3; } | nc -N 127.0.0.1 "$PORT_B")"
check "no holder on any node: not implemented, at once" '{"id":2,"notImplemented":true}' \
    "$( { printf '{"id":2,"call":"greeter/none","method":"x"}\n'; sleep 0.3; } | timeout 2 nc -N 127.0.0.1 "$PORT_B")"
kill "$EXAMPLE"; wait "$EXAMPLE" 2>/dev/null || true
code=0; "$SWITCHBOARD" call greeter/hello hello '"Ada"' --port "$PORT_B" >/dev/null 2>&1 || code=$?
check "the holder gone: not implemented on node b too" 2 "$code"

STATS=$(printf '{"id":9,"call":"switchboard/stats","method":"get"}\n' | timeout 5 nc -N 127.0.0.1 "$PORT_A")
check "node a's stats show the bus" 'a True' \
    "$(python3 -c 'import json,sys; c=json.loads(sys.argv[1])["result"]["cluster"]; print(c["node"], c["connected"] and c["eventsOut"] >= 2)' "$STATS")"
finish
