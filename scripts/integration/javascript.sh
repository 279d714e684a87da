#!/usr/bin/env bash
# The JavaScript client under Node 20: its test suite (node --test, against servers it starts itself)
# and the snippet of docs/clients.md against a live server.
source "$(dirname "$0")/lib.bash"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SWITCHBOARD_ABS=$(cd "$(dirname "$SWITCHBOARD")" && pwd)/$(basename "$SWITCHBOARD")
command -v node >/dev/null 2>&1 || { echo "FAIL node is not installed"; exit 1; }

if (cd "$ROOT/clients/js" && SWITCHBOARD="$SWITCHBOARD_ABS" timeout 600 node --experimental-websocket --test test/); then
    PASSED=$((PASSED + 1))
else
    FAILED=$((FAILED + 1)); echo "FAIL the JavaScript client's tests (node --test clients/js/test/)"
fi

start_server
SNIPPET=$(mktemp --suffix .mjs)
awk '/^## JavaScript/ {on=1} on && /^```js/ {grab=1; next} grab && /^```/ {exit} grab' "$ROOT/docs/clients.md" |
    sed -e "s|127.0.0.1:7420|127.0.0.1:$PORT|" -e "s|'./clients/js/|'file://$ROOT/clients/js/|" >"$SNIPPET"
check "the JavaScript snippet of docs/clients.md" "Map(1) { 'hello' => [ 1, 2.5, 'x' ] }
0
1
2" "$(timeout 20 node --experimental-websocket --no-warnings "$SNIPPET" 2>&1)"
rm -f "$SNIPPET"
finish
