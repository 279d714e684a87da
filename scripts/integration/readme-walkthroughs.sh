#!/usr/bin/env bash
# The README's walk-throughs can be followed in order beside `scripts/serve` (terminal 1, ports 7420 and
# 7421): a walk-through that starts a server gives it a port of its own and says in which terminal, none
# starts a second scripts/serve in the background, and the CLI is the installed `switchboard`, which the
# README shows how to install before its first use.
source "$(dirname "$0")/lib.bash"
README=$(dirname "$0")/../../README.md
while read -r verdict name detail; do
    if [ "$verdict" = PASS ]; then PASSED=$((PASSED + 1)); echo "PASS ${name//_/ }"
    else FAILED=$((FAILED + 1)); echo "FAIL ${name//_/ }: $detail"; fi
done < <(python3 - "$README" <<'PY'
import re, sys

text = open(sys.argv[1]).read()
blocks = [(m.start(), m.group(1)) for m in re.finditer(r"^```console\n(.*?)^```", text, re.S | re.M)]
commands = [(at, line) for at, block in blocks for line in block.splitlines() if line.startswith("$ ")]

def report(name, problems):
    print(("PASS " if not problems else "FAIL ") + name.replace(" ", "_") + (" " + "; ".join(problems) if problems else ""))

ports, problems = {}, []
for _, line in commands:
    if re.search(r"\bswitchboard serve\b", line):
        port = re.search(r"--port (\d+)", line)
        if not port or port.group(1) in ("7420", "7421"):
            problems.append(f"no port of its own: {line}")
        elif port.group(1) in ports:
            problems.append(f"port {port.group(1)} again: {line}")
        else:
            ports[port.group(1)] = line
report("each switchboard serve has a port of its own, beside scripts/serve's 7420 and 7421", problems)

report("no second scripts/serve in the background",
       [line for _, line in commands if re.search(r"scripts/serve\b.*&\s*(#.*)?$", line)])

starters = re.compile(r"scripts/serve|switchboard serve|broker-example|nats-server")
report("each walk-through that starts a server says which terminal",
       [block.splitlines()[0] for _, block in blocks if starters.search(block) and "terminal" not in block])

report("the walk-throughs use the installed switchboard, not a build path",
       [line for _, line in commands if ".build/" in line])

first_cli = min((at for at, line in commands if re.match(r"\$ switchboard ", line)), default=None)
install = text.find("scripts/install")
report("scripts/install is shown before the first switchboard command",
       [] if first_cli is None or 0 <= install < first_cli else ["first `$ switchboard` line comes before any mention of scripts/install"])
PY
)
finish
