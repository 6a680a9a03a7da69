#!/usr/bin/env python3
"""A simulator scenario that replays TRACE with a live server's settings.

Usage: tools/scenario_from_config.py EFFECTIVE.toml TRACE [REPLICAS]

EFFECTIVE.toml is `abe config show` of the server (defaults, file, ABE_* environment):
its continuous settings (slots, step budget, prefill chunk, queue, prefix caching, block
size), request timeout and latency model (roofline with its LLM, GPU, tensor parallelism
and efficiencies; `auto` is roofline in continuous mode) become the scenario's [engine] and
[latency], so `abe simulate --scenario OUT --trace TRACE` schedules what the server runs.
REPLICAS (default: workers.count) is the simulated replica count: a router tier of N
one-replica servers is N replicas. Used by tools/sim_vs_live.sh and tools/cluster.sh.
Prints the scenario on stdout.
"""
import sys
import tomllib


def ms(v):
    """A config duration ("30s", "5m", "250ms" or integer milliseconds) in ms."""
    if isinstance(v, int):
        return v
    for unit, k in (("ms", 1), ("s", 1000), ("m", 60000), ("h", 3600000)):
        num = v[: -len(unit)]
        if v.endswith(unit) and num.replace(".", "", 1).isdigit():
            return float(num) * k
    raise SystemExit(f"cannot read the duration {v!r}")


def main():
    if len(sys.argv) not in (3, 4):
        raise SystemExit(__doc__)
    with open(sys.argv[1], "rb") as f:
        c = tomllib.load(f)
    trace = sys.argv[2]
    k, w = c["continuous"], c["workers"]
    replicas = int(sys.argv[3]) if len(sys.argv) == 4 else w["count"]
    print(f'''name = "live_settings"
description = "{trace} replayed with a live server's settings."
requests = 4294967294

[workload.arrivals]
process = "replay"
path = "{trace}"

[engine]
mode = "continuous"
workers = {replicas}
max_slots = {k["max_slots"]}
n_batch = {k["n_batch"]}
prefill_chunk = {k["prefill_chunk"]}
queue_capacity = {k["max_queue"]}
prefix_caching = {str(k["prefix_caching"]).lower()}
kv_block_tokens = {k["kv_block_tokens"]}
request_timeout_ms = {ms(c["batching"]["request_timeout"])}
''')
    model = w["latency_model"]
    if model in ("roofline", "auto"):
        print(f'''[latency]
model = "roofline"
llm = "{w["llm"]}"
gpu = "{w["gpu"]}"
tp = {w["tp"]}
flops_efficiency = {w["flops_efficiency"]}
bandwidth_efficiency = {w["bandwidth_efficiency"]}''')
    else:
        print(f'[latency]\nmodel = "{model}"')


if __name__ == "__main__":
    main()
