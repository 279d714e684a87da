#!/usr/bin/env bash
# The CLI client (call, listen, send, ping): its JSON output and its exit codes.
source "$(dirname "$0")/lib.bash"
start_server
export SWITCHBOARD_PORT=$PORT

# run NAME EXPECTED_STATUS EXPECTED_STDOUT COMMAND…
run() {
    local name=$1 status=$2 expected=$3; shift 3
    local actual code=0
    actual=$("$SWITCHBOARD" "$@" 2>/dev/null) || code=$?
    check "$name (stdout)" "$expected" "$actual"
    check "$name (exit code)" "$status" "$code"
}

run "call echo" 0 '{"hello":[1,2.5,"x"]}' call switchboard/echo echo '{"hello":[1,2.5,"x"]}'
run "call without arguments" 0 'null' call switchboard/echo echo
run "call json codec" 0 '[1,{"a":null}]' call switchboard/echo.json echo '[1,{"a":null}]' --codec json
run "error envelope" 1 '{"error":{"code":"demo_error","message":"requested failure","details":"why"}}' \
    call switchboard/echo fail '"why"'
run "not implemented" 2 '' call switchboard/echo nope
run "bad arguments" 64 '' call switchboard/echo echo '{not json'
run "connection failure" 3 '' call switchboard/echo echo 1 --port 1
run "listen until end" 0 $'0\n1\n2' listen switchboard/ticker '{"count":3,"intervalMs":5}'
run "listen --count" 0 $'0\n1' listen switchboard/ticker '{"intervalMs":5}' --count 2
run "listen refused" 1 '{"error":{"code":"bad_arguments","message":"count must be a non-negative integer","details":null}}' \
    listen switchboard/ticker '{"count":-1}'
run "send standard" 0 '{"a":[1,2]}' send switchboard/message '{"a":[1,2]}'
run "send string" 0 '"plain text"' send switchboard/message.string 'plain text' --codec string
run "send binary text" 0 '[104,105]' send switchboard/message.binary hi --codec binary
run "send binary array" 0 '[0,255]' send switchboard/message.binary '[0,255]' --codec binary
run "send to room" 0 'null' send switchboard/room.post 'hello room' --codec binary

pings=$("$SWITCHBOARD" ping --count 3 --interval 0.01)
check "ping prints one JSON line per round trip" 3 "$(grep -cE '^\{"seq":[0-9]+,"rttMs":[0-9.]+\}$' <<<"$pings")"
check "token from the environment" "1" "$(SWITCHBOARD_TOKEN=ignored "$SWITCHBOARD" call switchboard/echo echo 1)"
for command in call listen send ping; do
    check "$command --help shows an example" 1 "$("$SWITCHBOARD" "$command" --help | grep -c 'Example')"
done
finish
