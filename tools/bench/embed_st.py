#!/usr/bin/env python3
"""sentence-transformers' own cost per request for the sentence benches/embed_forward.rs
uses (16 tokens), at batches of 1, 8 and 64: the compute ceiling abe's `embed` executor is
held to. Median of --repeats timed `encode` calls per batch after one warm-up call.

Usage (venv as in tools/embed_reference.py):
    /tmp/st/bin/python tools/bench/embed_st.py "$(tools/fetch_minilm.sh)" [--threads 2]
Prints one JSON line per batch size.
"""
import argparse
import json
import statistics
import time

import torch
from sentence_transformers import SentenceTransformer

SENTENCE = "The quick brown fox jumps over the lazy dog near the quiet river bank"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = SentenceTransformer(args.model_dir, device="cpu")
    tokens = int(model.tokenize([SENTENCE])["attention_mask"].sum())
    for batch in (1, 8, 64):
        inputs = [SENTENCE] * batch
        model.encode(inputs, batch_size=batch)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            model.encode(inputs, batch_size=batch)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(
            json.dumps(
                {
                    "batch": batch,
                    "tokens": tokens,
                    "threads": args.threads,
                    "batch_ms_median": round(med * 1e3, 3),
                    "per_request_ms": round(med * 1e3 / batch, 3),
                    "batch_ms_min": round(min(times) * 1e3, 3),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
