"""Triton peer (PyTriton): one model instance whose batch of n sleeps a + b*n ms, behind
Triton's dynamic batcher (max batch 32, max_queue_delay_microseconds = PEER_TRITON_DELAY_US,
default 0: Triton's default, release as soon as the instance is free).

Usage: python triton_server.py HTTP_PORT  (gRPC on HTTP_PORT+1, metrics off; loopback only).
PEER_A_MS and PEER_B_MS set a and b. Needs Debian's /usr/bin/python3 (PyTriton's bundled
tritonserver loads that interpreter's libpython for its Python backend).
"""

import os
import sys
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig

A_MS = float(os.environ.get("PEER_A_MS", "10"))
B_MS = float(os.environ.get("PEER_B_MS", "2"))
DELAY_US = int(os.environ.get("PEER_TRITON_DELAY_US", "0"))


@batch
def infer(x):
    time.sleep((A_MS + B_MS * x.shape[0]) / 1000.0)
    return {"y": x}


def main():
    port = int(sys.argv[1])
    config = TritonConfig(
        http_address="127.0.0.1",
        http_port=port,
        grpc_address="127.0.0.1",
        grpc_port=port + 1,
        allow_metrics=False,
    )
    with Triton(config=config) as triton:
        triton.bind(
            model_name="sleeper",
            infer_func=infer,
            inputs=[Tensor(name="x", dtype=np.int32, shape=(1,))],
            outputs=[Tensor(name="y", dtype=np.int32, shape=(1,))],
            config=ModelConfig(
                max_batch_size=32,
                batcher=DynamicBatcher(max_queue_delay_microseconds=DELAY_US),
            ),
            strict=False,
        )
        print("triton ready", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
