#!/usr/bin/env bash
# The walk-throughs of the README and of the guides in docs/ can be followed beside `scripts/serve`
# (terminal 1, ports 7420 and 7421), each page in order and the pages side by side: a walk-through that
# starts a server gives it a port of its own (on every page) and says in which terminal, none starts a
# second scripts/serve in the background, and the CLI is the installed `switchboard`, which each page
# shows how to install before its first use. Every relative link of these pages leads to a file.
source "$(dirname "$0")/lib.bash"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
while read -r verdict name detail; do
    if [ "$verdict" = PASS ]; then PASSED=$((PASSED + 1)); echo "PASS ${name//_/ }"
    else FAILED=$((FAILED + 1)); echo "FAIL ${name//_/ }: $detail"; fi
done < <(cd "$ROOT" && python3 - README.md docs/*.md <<'PY'
import os, re, sys

pages = {path: open(path).read() for path in sys.argv[1:]}
blocks = [(path, m.start(), m.group(1)) for path, text in pages.items()
          for m in re.finditer(r"^```console\n(.*?)^```", text, re.S | re.M)]
commands = [(path, at, line) for path, at, block in blocks for line in block.splitlines() if line.startswith("$ ")]

def report(name, problems):
    print(("PASS " if not problems else "FAIL ") + name.replace(" ", "_") + (" " + "; ".join(problems) if problems else ""))

ports, problems = {}, []
for path, _, line in commands:
    if re.search(r"\bswitchboard serve\b", line):
        port = re.search(r"--port (\d+)", line)
        if not port or port.group(1) in ("7420", "7421"):
            problems.append(f"{path}: no port of its own: {line}")
        elif port.group(1) in ports:
            problems.append(f"{path}: port {port.group(1)} again: {line}")
        else:
            ports[port.group(1)] = line
report("each switchboard serve has a port of its own, beside scripts/serve's 7420 and 7421", problems)

report("no second scripts/serve in the background",
       [f"{path}: {line}" for path, _, line in commands if re.search(r"scripts/serve\b.*&\s*(#.*)?$", line)])

starters = re.compile(r"scripts/serve|switchboard serve|broker-example|nats-server")
report("each walk-through that starts a server says which terminal",
       [f"{path}: {block.splitlines()[0]}" for path, _, block in blocks if starters.search(block) and "terminal" not in block])

report("the walk-throughs use the installed switchboard, not a build path",
       [f"{path}: {line}" for path, _, line in commands if ".build/" in line])

problems = []
for path, text in pages.items():
    first_cli = min((at for p, at, line in commands if p == path and re.match(r"\$ switchboard ", line)), default=None)
    install = text.find("scripts/install")
    if first_cli is not None and not 0 <= install < first_cli:
        problems.append(f"{path}: first `$ switchboard` line comes before any mention of scripts/install")
report("each page shows scripts/install before its first switchboard command", problems)

problems = []
for path, text in pages.items():
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if "://" in target or target.startswith("mailto:") or target.startswith("#"):
            continue
        if not os.path.exists(os.path.join(os.path.dirname(path), target.split("#")[0])):
            problems.append(f"{path}: {target}")
report("every relative link of the README and docs/ leads to a file", problems)
PY
)
finish
