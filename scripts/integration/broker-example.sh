#!/usr/bin/env bash
# The broker walk-through of docs/clients.md: Examples/BrokerExample serves channels that other clients use.
source "$(dirname "$0")/lib.bash"
EXAMPLE="$(dirname "$SWITCHBOARD")/broker-example"
start_server
"$EXAMPLE" --port "$PORT" >/dev/null 2>&1 &
EXAMPLE_PID=$!
trap 'kill $EXAMPLE_PID 2>/dev/null || true; stop_server; rm -f "$LOG"' EXIT
export SWITCHBOARD_PORT=$PORT
for _ in $(seq 1 100); do  # until the example has registered
    "$SWITCHBOARD" call greeter/hello hello '"x"' >/dev/null 2>&1 && break
    sleep 0.05
done
check "call a client-held method channel" '"Hello, Ada!"' "$("$SWITCHBOARD" call greeter/hello hello '"Ada"')"
check "listen to a client-held event channel" 2 "$("$SWITCHBOARD" listen greeter/clock --count 2 | grep -cE '^[0-9]{10}$')"
text=$( { printf '{"id":1,"call":"greeter/hello","method":"hello","args":"nc"}\n'; sleep 0.3; } | nc -N 127.0.0.1 "$PORT")
check "a text client calls it too" '{"id":1,"result":"Hello, nc!"}' "$text"
stats=$("$SWITCHBOARD" call switchboard/stats get)
check "stats count the registrations" 2 "$(sed -n 's/.*"registrations":\([0-9]*\).*/\1/p' <<<"$stats")"
kill "$EXAMPLE_PID"; wait "$EXAMPLE_PID" 2>/dev/null || true
code=0; "$SWITCHBOARD" call greeter/hello hello '"Ada"' >/dev/null 2>&1 || code=$?
check "the holder gone: not implemented" 2 "$code"
finish
