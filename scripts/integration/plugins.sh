#!/usr/bin/env bash
# Plugins from a --config file, driven with nc: access control (forbidden, a user's token, deny wins),
# a rate limit (rate_limited with retryAfterMs), an alias, SIGHUP reloads (a live connection's rights
# change; a broken file keeps the old settings), a broken file at start-up (exit 78, EX_CONFIG), and
# the plugin guide's example config (docs/plugins-and-security.md) with the answers it shows.
source "$(dirname "$0")/lib.bash"
CONFIG=$(mktemp --suffix .json)
trap 'stop_server; rm -f "$LOG" "$CONFIG"' EXIT
hash_of() { printf %s "$1" | sha256sum | cut -c1-64; }

# write_config ANONYMOUS_CALLS: the config, with the anonymous call rights given.
write_config() {
    cat >"$CONFIG" <<JSON
{
  "aliases": {"legacy/echo": "switchboard/echo"},
  "access": {
    "users": [{"name": "ops", "tokenSha256": "$(hash_of ops-secret)", "deny": {"call": ["switchboard/stats"]}}],
    "anonymous": {"allow": {"call": $1, "listen": ["switchboard/ticker"], "send": [], "register": []}}
  },
  "rateLimits": [{"channels": ["switchboard/echo"], "perConnection": {"rate": 1, "burst": 2}}],
  "requestLog": {"sampleOneIn": 1}
}
JSON
}

write_config '["switchboard/echo"]'
start_server --config "$CONFIG"

text_session "anonymous: allowed, forbidden, forbidden listen" \
'{"id":1,"call":"switchboard/echo","method":"echo","args":"hi"}\n{"id":2,"call":"switchboard/stats","method":"get"}\n{"id":3,"listen":"switchboard/room"}\n' \
'{"id":1,"result":"hi"}
{"id":2,"error":{"code":"forbidden","message":"anonymous connections may not call on switchboard/stats"}}
{"id":3,"error":{"code":"forbidden","message":"anonymous connections may not listen on switchboard/room"}}'

text_session "a user: deny wins over everything allowed" \
'{"id":1,"hello":{"token":"ops-secret"}}\n{"id":2,"call":"switchboard/stats","method":"get"}\n{"id":3,"send":"switchboard/message","message":1}\n' \
"$(printf '%s\n' '{"id":1,"welcome":{"version":1,"server":"switchboard/0.1.0","maxFrame":16777216,"heartbeatMs":0}}' \
'{"id":2,"error":{"code":"forbidden","message":"user ops may not call on switchboard/stats"}}' \
'{"id":3,"reply":1}')"

text_session "a wrong token is unauthorized and closes" '{"id":1,"hello":{"token":"guess"}}\n{"id":2,"ping":true}\n' \
'{"id":1,"error":{"code":"unauthorized","message":"a valid token is required"}}' 0.3

# A user's connection has a bucket of its own (anonymous ones share one per address, which the first
# session above has drawn on).
text_session "rate limit: a burst of 2, then rate_limited with retryAfterMs" \
'{"id":0,"hello":{"token":"ops-secret"}}\n{"id":1,"call":"legacy/echo","method":"echo","args":1}\n{"id":2,"call":"switchboard/echo","method":"echo","args":2}\n{"id":3,"call":"switchboard/echo","method":"echo","args":3}\n' \
"$(printf '%s\n' '{"id":0,"welcome":{"version":1,"server":"switchboard/0.1.0","maxFrame":16777216,"heartbeatMs":0}}' \
'{"id":1,"result":1}' '{"id":2,"result":2}' \
'{"id":3,"error":{"code":"rate_limited","message":"over the rate limit: retry after 1000 ms","details":{"retryAfterMs":1000}}}')"

# binary: a forbidden call gets ERROR forbidden with its id (7), and the connection stays open (PING 8).
CALL_PAYLOAD=07$(printf '%02x' 3)$(hex_of get)00
CHANNEL=$(hex_of switchboard/stats)
binary_session "binary: ERROR forbidden with the request's id, connection open" \
"$(printf '%08x' $((8 + 17 + 6)))03 00 0011 00000007 $CHANNEL $CALL_PAYLOAD  00000008 05 00 0000 00000008" \
"$(printf '%08x' $((8 + $(printf '{"code":"forbidden","message":"anonymous connections may not call on switchboard/stats"}' | wc -c))))07 00 0000 00000007 $(hex_of '{"code":"forbidden","message":"anonymous connections may not call on switchboard/stats"}') 00000008 06 00 0000 00000008"

grep -q 'switchboard.requests: channel=switchboard/echo connection=[0-9]* durationUs=[0-9]* method=echo outcome=success user=- .* request$' "$LOG" \
    && check "the request log has a line per request" ok ok \
    || check "the request log has a line per request" "a log line" "$(cat "$LOG")"

# SIGHUP: one live connection; its rights change between two of its requests.
ANSWERS=$(mktemp)
trap 'stop_server; rm -f "$LOG" "$CONFIG" "$ANSWERS"' EXIT
{ printf '{"id":1,"call":"switchboard/stats","method":"get"}\n'; sleep 0.5
  printf '{"id":2,"call":"switchboard/stats","method":"get"}\n'; sleep 0.5
  printf '{"id":3,"call":"switchboard/stats","method":"get"}\n'; sleep 0.3; } | timeout 10 nc -N 127.0.0.1 "$PORT" >"$ANSWERS" &
SESSION=$!
sleep 0.25
write_config '["switchboard/*"]'
kill -HUP "$SERVER_PID"
sleep 0.5
printf '{"access": {"users": [}' >"$CONFIG"  # broken: the reload keeps the widened rights
kill -HUP "$SERVER_PID"
wait "$SESSION" || true
answers=$(sed 's/"result":{.*}}$/"result":STATS}/' "$ANSWERS")
check "SIGHUP: a live connection's rights change from its next request; a broken file keeps them" \
'{"id":1,"error":{"code":"forbidden","message":"anonymous connections may not call on switchboard/stats"}}
{"id":2,"result":STATS}
{"id":3,"result":STATS}' "$answers"
sleep 0.2
grep -q 'config reload failed, keeping the previous configuration: .*line 1, column' "$LOG" \
    && check "a broken reload is logged with its line" ok ok \
    || check "a broken reload is logged with its line" "a log line" "$(cat "$LOG")"
stop_server

# The plugin guide's example, as printed there: its config file, and the answers its two nc commands show.
GUIDE=$(dirname "$0")/../../docs/plugins-and-security.md
awk '/^\$ cat switchboard.json$/ { on = 1; next } /^\$ switchboard serve --config/ { on = 0 } on' "$GUIDE" >"$CONFIG"
start_server --config "$CONFIG"
expected_forbidden=$(awk '/^\$ printf .*switchboard\/stats/ { getline; print; exit }' "$GUIDE")
text_session "the guide: an anonymous stats call is forbidden" '{"id":1,"call":"switchboard/stats","method":"get"}\n' "$expected_forbidden"
expected_user=$(awk '/^    \| nc -N 127\.0\.0\.1 [0-9]+$/ { on = 1; next } on && /^```/ { exit } on' "$GUIDE")
text_session "the guide: the app user may send" '{"id":1,"hello":{"token":"app-secret"}}\n{"id":2,"send":"switchboard/message","message":"hi"}\n' \
    "$expected_user"
stop_server

# A broken file at start-up: a message naming the key, and exit status 78.
printf '{"access": {"anonymus": {}}}' >"$CONFIG"
status=0
message=$(trap - EXIT; timeout 10 "$SWITCHBOARD" serve --port 0 --config "$CONFIG" 2>&1) || status=$?
check "a broken file at start-up exits 78 naming the key" \
"78 switchboard: invalid configuration: $CONFIG: at access.anonymus: unknown key (known: anonymous, users)" "$status $message"
finish
