#!/usr/bin/env bash
# scripts/install puts a working `switchboard` on the PATH (the debug build here, into a temporary
# prefix): the CLI lines of the README and docs/ then work from any directory.
source "$(dirname "$0")/lib.bash"
start_server
prefix=$(mktemp -d)
(cd "$(dirname "$0")/../.." && CONFIGURATION=debug PREFIX="$prefix" scripts/install >/dev/null 2>&1)
check "scripts/install puts switchboard in PREFIX/bin" "yes" "$([ -x "$prefix/bin/switchboard" ] && echo yes || echo no)"
check "the installed switchboard calls the server from anywhere" '"hi"' \
    "$(cd / && PATH="$prefix/bin:$PATH" switchboard call switchboard/echo echo '"hi"' --port "$PORT" 2>&1)"
rm -rf "$prefix"
finish
