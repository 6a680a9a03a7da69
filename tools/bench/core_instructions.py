#!/usr/bin/env python3
"""Per-request instructions of one core bench run under callgrind (issue 25's decision cost).

Reads a callgrind file of `benches/core.rs` (`BIN --bench --profile-time 2 'core/NAME$'`) and
prints the timed loop's inclusive instructions (`Bencher::iter_custom`) over the requests it
admitted (calls of `Core::admit`), then the inclusive instructions a request and a call of
the core's parts. Standard library only.
Usage: tools/bench/core_instructions.py CALLGRIND_FILE
"""
import collections
import re
import sys

PARTS = ["fill_from_classes", "Core>::complete", "due_group", "summarize", "emit_dispatch",
         "CostModel::observe", "Auto::decide", "SlaController::update"]

names, calls, incl = {}, collections.Counter(), collections.Counter()
pending, expect = None, False
for line in open(sys.argv[1]):
    m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip())
    if m:
        kind, i, name = m.groups()
        if name:
            names[i] = name
        if kind == "cfn":
            pending = i
        continue
    m = re.match(r"calls=(\d+)", line)
    if m:
        calls[pending] += int(m.group(1))
        expect = True
        continue
    if expect:
        fields = line.split()
        if len(fields) >= 2:
            incl[pending] += int(fields[1])
        expect = False

requests = sum(calls[i] for i, n in names.items() if n.endswith("Core>::admit"))
loop = sum(incl[i] for i, n in names.items() if "Bencher<M>::iter_custom" in n)
if requests == 0:
    sys.exit("no Core::admit calls in this file: is it a core bench run?")
print(f"requests {requests}, instructions a request (the timed loop) {loop / requests:.0f}")
for part in PARTS:
    for i, n in names.items():
        if n.endswith(part) and calls[i]:
            print(f"  {part:22} {incl[i] / requests:7.0f} a request {incl[i] / calls[i]:7.0f} a call")
