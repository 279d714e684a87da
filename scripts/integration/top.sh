#!/usr/bin/env bash
# `switchboard top` in a real terminal: tmux runs it, capture-pane reads the screen, send-keys presses keys.
source "$(dirname "$0")/lib.bash"
command -v tmux >/dev/null 2>&1 || { echo "FAIL tmux is not installed (scripts/setup installs it)"; exit 1; }
start_server
SESSION="switchboard-top-$$"
# A client that names itself and stays, and a stream of events for the rates.
{ printf '{"id":1,"hello":{"client":"watched-by-top"}}\n'; sleep 30; } | nc 127.0.0.1 "$PORT" >/dev/null &
WATCHED=$!
"$SWITCHBOARD" listen switchboard/ticker '{"intervalMs":10}' --port "$PORT" >/dev/null &
LISTENER=$!
trap 'tmux kill-session -t "$SESSION" 2>/dev/null || true; kill $WATCHED $LISTENER 2>/dev/null || true; stop_server; rm -f "$LOG"' EXIT

tmux new-session -d -s "$SESSION" -x 150 -y 40 "$SWITCHBOARD top --port $PORT"
screen() { tmux capture-pane -p -t "$SESSION" 2>/dev/null; }
# wait_for NAME PATTERN: the screen shows PATTERN (an extended regex) within 10 s.
wait_for() {
    for _ in $(seq 1 100); do
        if screen | grep -Eq -- "$2"; then PASSED=$((PASSED + 1)); return 0; fi
        sleep 0.1
    done
    FAILED=$((FAILED + 1))
    printf 'FAIL %s: no /%s/ on the screen:\n%s\n' "$1" "$2" "$(screen)"
}

wait_for "header" "^switchboard top  127\.0\.0\.1:$PORT  up [0-9]+s  connections [0-9]+"
wait_for "the named client is listed" "watched-by-top +tcp/text"
wait_for "the listener's transport" "tcp/binary"
wait_for "the ticker's events per second" "^switchboard/ticker +event +standard +no +1 +[0-9.]+ +[1-9][0-9.]* *$"
wait_for "the totals line has rates" "^requests/s [0-9.]+  events/s [1-9][0-9.]*"
wait_for "sorted by id at first" "sorted by id ▲"
tmux send-keys -t "$SESSION" 2
wait_for "key 2 sorts by client" "sorted by client ▲"
tmux send-keys -t "$SESSION" 2
wait_for "again reverses it" "sorted by client ▼"
tmux send-keys -t "$SESSION" 6
wait_for "key 6 sorts by bytes out, largest first" "sorted by out ▼"
tmux send-keys -t "$SESSION" q
for _ in $(seq 1 50); do tmux has-session -t "$SESSION" 2>/dev/null || break; sleep 0.1; done
if tmux has-session -t "$SESSION" 2>/dev/null; then
    FAILED=$((FAILED + 1)); echo "FAIL q did not quit"
else
    PASSED=$((PASSED + 1))
fi
finish
