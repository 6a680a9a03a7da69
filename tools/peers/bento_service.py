"""BentoML peer: one service instance whose batchable API sleeps a + b*n ms for a batch of n.

BentoML's adaptive batcher (max_batch_size 32, max_latency_ms generous so it never refuses)
decides when to release a batch; the API only models the executor. PEER_A_MS and PEER_B_MS
set a and b. Started by tools/peers/run.sh with `bentoml serve bento_service:Sleeper`.
"""

import os
import time

import bentoml

A_MS = float(os.environ.get("PEER_A_MS", "10"))
B_MS = float(os.environ.get("PEER_B_MS", "2"))


# No access log: abe and Triton write none per request either.
@bentoml.service(
    workers=1,
    traffic={"timeout": 120, "max_concurrency": 4096},
    logging={"access": {"enabled": False}},
)
class Sleeper:
    @bentoml.api(batchable=True, max_batch_size=32, max_latency_ms=60_000)
    def infer(self, x: list[int]) -> list[int]:
        time.sleep((A_MS + B_MS * len(x)) / 1000.0)
        return x
