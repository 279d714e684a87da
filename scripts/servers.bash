# Shared by the scripts that put a release server under load: scripts/soak, attacks and chaos, and the
# bench-* scripts (source it from the repository root). A scratch directory $WORK; start_server runs
# the release server on a free loopback port and sets SERVER_PID and PORT; on EXIT, cleanup stops it and
# every other process the script left running in the background, and removes $WORK.
SERVER_PID=
SERVER_LOG=
WORK=$(mktemp -d)

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

# free_port: a loopback TCP port that nothing listens on now (for a server that needs its port in advance).
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# cpu_ticks "PID…": the processes' user + system CPU time so far, in clock ticks.
cpu_ticks() { local pid total=0; for pid in $1; do total=$(( total + $(awk '{print $14 + $15}' "/proc/$pid/stat") )); done; echo "$total"; }

# cleanup: stops the server of start_server, then every background job still running, and removes $WORK.
cleanup() {
    stop_server || true
    local pids
    pids=$(jobs -rp)
    if [ -n "$pids" ]; then kill $pids 2>/dev/null || true; fi
    wait 2>/dev/null || true
    rm -rf "$WORK"
}
trap cleanup EXIT
