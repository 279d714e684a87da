#!/usr/bin/env bash
# The Python client (clients/python) as a test author uses it: `pip install` into .build/venv (offline:
# scripts/setup put pytest and the build backend there), then its pytest suite and the example of docs/clients.md,
# whose servers the installed plugin starts from $SWITCHBOARD. A run that collects no test, or skips
# one, fails.
source "$(dirname "$0")/lib.bash"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PYTHON=$ROOT/.build/venv/bin/python
SWITCHBOARD_ABS=$(cd "$(dirname "$SWITCHBOARD")" && pwd)/$(basename "$SWITCHBOARD")

if ! "$PYTHON" -m pip install -q --no-deps --no-build-isolation "$ROOT/clients/python"; then
    echo "FAIL pip install ./clients/python into .build/venv (run scripts/setup)"
    FAILED=$((FAILED + 1))
    finish
fi

OUTPUT=$(mktemp)
trap 'stop_server; rm -f "$LOG" "$OUTPUT"' EXIT
status=0
(cd "$ROOT/clients/python" && SWITCHBOARD="$SWITCHBOARD_ABS" timeout 600 "$PYTHON" -m pytest -q -p no:cacheprovider \
    --strict-markers tests examples) >"$OUTPUT" 2>&1 || status=$?
summary=$(tail -n 1 "$OUTPUT")
if [ "$status" -eq 0 ] && [[ "$summary" == *" passed"* ]] && [[ "$summary" != *skipped* ]]; then
    PASSED=$((PASSED + 1))
    echo "pytest: $summary"
else
    FAILED=$((FAILED + 1))
    cat "$OUTPUT"
    echo "FAIL the Python client's tests (pytest exited with status $status: $summary)"
fi
finish
