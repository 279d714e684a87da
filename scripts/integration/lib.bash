# Helpers for the nc-driven integration tests. Source it; $1 of the test is the switchboard binary.
set -euo pipefail
SWITCHBOARD=${1:?usage: $0 path/to/switchboard}
PASSED=0
FAILED=0
SERVER_PID=
LOG=$(mktemp)

# start_server [serve options…]: starts a server on a free port and sets PORT; with SWITCHBOARD_LOOPS
# set, on that many loops (the default: one per core).
start_server() {
    "$SWITCHBOARD" serve --port 0 --log-level notice ${SWITCHBOARD_LOOPS:+--loops "$SWITCHBOARD_LOOPS"} "$@" 2>"$LOG" &
    SERVER_PID=$!
    PORT=$(logged_port "listening on") || exit 1
}

# logged_port WHAT: the port of the server's "WHAT 127.0.0.1:PORT" log line, once it is there.
logged_port() {
    local port
    for _ in $(seq 1 100); do
        port=$(sed -n "s/.*$1 [0-9.]*:\([0-9]*\).*/\1/p" "$LOG")
        [ -n "$port" ] && { echo "$port"; return 0; }
        sleep 0.05
    done
    echo "server did not start:" >&2; cat "$LOG" >&2; exit 1
}

stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    kill -INT "$SERVER_PID" 2>/dev/null || true
    local status=0
    wait "$SERVER_PID" || status=$?
    SERVER_PID=
    if [ "$status" -ne 0 ]; then echo "FAIL server exited with status $status on SIGINT"; FAILED=$((FAILED + 1)); fi
}
trap 'stop_server; rm -f "$LOG"' EXIT

# text_session NAME INPUT EXPECTED [HOLD]: sends INPUT (printf format) in text mode, keeps the connection
# open HOLD seconds (default 0: half-close at once), and compares every answer line with EXPECTED.
text_session() {
    local name=$1 input=$2 expected=$3 hold=${4:-0}
    local actual
    actual=$( { printf "$input"; sleep "$hold"; } | timeout 10 nc -N 127.0.0.1 "$PORT" || true)
    check "$name" "$expected" "$actual"
}

# binary_session NAME HEX EXPECTED_HEX [HOLD]: the same with binary frames written as hex.
binary_session() {
    local name=$1 hex=$2 expected=$3 hold=${4:-0}
    local actual
    actual=$( { printf '%s' "$hex" | tr -d ' \n' | xxd -r -p; sleep "$hold"; } | timeout 10 nc -N 127.0.0.1 "$PORT" | xxd -p | tr -d '\n' || true)
    check "$name" "$(printf '%s' "$expected" | tr -d ' \n')" "$actual"
}

check() {
    if [ "$2" == "$3" ]; then
        PASSED=$((PASSED + 1))
    else
        FAILED=$((FAILED + 1))
        printf 'FAIL %s\n--- expected\n%s\n--- actual\n%s\n' "$1" "$2" "$3"
    fi
}

# hex_of TEXT: the bytes of TEXT as hex.
hex_of() { printf '%s' "$1" | xxd -p | tr -d '\n'; }

finish() {
    stop_server
    echo "$PASSED passed, $FAILED failed"
    [ "$FAILED" -eq 0 ]
}
