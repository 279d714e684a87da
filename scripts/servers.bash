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

# Side-by-side runs, one loop each, a server pinned to the last core and the load (`switchboard bench`)
# to the first: a script defines `serve NAME PORT`, which starts its server NAME on PORT in the
# background (through "${PINNED[@]}"), and calls measure for each server, round by round.
PINNED=(taskset -c "$(( $(nproc) - 1 ))")

# measure NAME WORKLOAD-ARGS…: one run of `bench WORKLOAD-ARGS…` against a fresh server NAME (spoken to
# as Redis when NAME is redis, else as Switchboard); appends a JSON line (server, workload, rate, p99, and the server's
# CPU time per operation over the middle of the run, which holds where the server may not get its core)
# to $WORK/results.
measure() {
    local name=$1; shift
    local port pid bench before ticks target=switchboard
    [ "$name" = redis ] && target=redis
    port=$(free_port)
    serve "$name" "$port"
    pid=$!
    for _ in $(seq 1 100); do nc -z 127.0.0.1 "$port" 2>/dev/null && break; sleep 0.05; done
    taskset -c 0 .build/release/switchboard bench "$@" --target "$target" --port "$port" --duration "${DURATION:-3}" \
        --warmup 0.5 --json > "$WORK/run.json" &
    bench=$!
    sleep 1; before=$(cpu_ticks "$pid"); sleep 1.5
    ticks=$(( $(cpu_ticks "$pid") - before ))
    wait "$bench"
    python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(json.dumps({"server": sys.argv[2], "workload": sys.argv[3], "rate": r["rate"], "p99": r.get("latencyMicros", {}).get("p99"), "cpuMicros": int(sys.argv[4]) * 1e6 / int(sys.argv[5]) / 1.5 / r["rate"]}))' \
        "$WORK/run.json" "$name" "$*" "$ticks" "$(getconf CLK_TCK)" >> "$WORK/results"
    kill "$pid"; wait "$pid" 2>/dev/null || true
}

# measured_table NAME…: the medians of $WORK/results as a table, with the first server's rate as a ratio
# to each other's (— where a server did not run a workload).
measured_table() {
    python3 - "$WORK/results" "$@" <<'PY'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
names = sys.argv[2:]
print("| workload | " + " | ".join(f"{n}, ops/s" for n in names) + " | " + " | ".join(f"{names[0]} ÷ {n}" for n in names[1:])
      + " | server CPU µs per op: " + ", ".join(names) + " | p99 µs: " + ", ".join(names) + " |")
print("|---" * (2 * len(names) + 2) + "|")
for workload in dict.fromkeys(r["workload"] for r in rows):
    def median(name, key):
        values = [r[key] for r in rows if r["workload"] == workload and r["server"] == name and r[key] is not None]
        return statistics.median(values) if values else float("nan")
    def shown(value, form):
        return "—" if value != value else format(value, form)  # NaN: not run
    rates = [median(n, "rate") for n in names]
    print(f"| {workload} | " + " | ".join(shown(r, ",.0f") for r in rates) + " | "
          + " | ".join(shown(rates[0] / r, ".3f") + ("×" if r == r else "") for r in rates[1:]) + " | "
          + ", ".join(shown(median(n, "cpuMicros"), ".3f") for n in names) + " | "
          + ", ".join(shown(median(n, "p99"), ",.0f") for n in names) + " |")
PY
}

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
