# Shared by scripts/soak and scripts/attacks (source it from the repository root): builds the release
# server and runs it on a free loopback port. Sets SERVER_PID and PORT; stop_server on EXIT.
SERVER_PID=
SERVER_LOG=

build_server() {
    scripts/setup
    swift build -c release --product switchboard
}

# start_server [serve options…]
start_server() {
    SERVER_LOG=$(mktemp)
    .build/release/switchboard serve --port 0 --log-level notice "$@" 2>"$SERVER_LOG" &
    SERVER_PID=$!
    for _ in $(seq 1 100); do
        PORT=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$SERVER_LOG")
        [ -n "$PORT" ] && return 0
        sleep 0.05
    done
    echo "server did not start:" >&2; cat "$SERVER_LOG" >&2; exit 1
}

# stop_server: SIGTERM (a background job of a non-interactive shell inherits SIGINT as ignored), then
# wait; prints the server's log when it did not exit 0.
stop_server() {
    [ -n "$SERVER_PID" ] || return 0
    local status=0
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" || status=$?
    SERVER_PID=
    if [ "$status" -ne 0 ]; then
        echo "server exited with status $status; its log:" >&2
        tail -n 20 "$SERVER_LOG" >&2
    fi
    rm -f "$SERVER_LOG"
    return "$status"
}
trap 'stop_server || true' EXIT
