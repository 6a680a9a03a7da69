#!/usr/bin/env python3
"""ONNX Runtime on all-MiniLM-L6-v2: what the `ort` kernel choice would buy (issue 16).

Times the BERT encoder + mean pooling + normalisation under onnxruntime's CPU provider on
the sentence and batches of benches/embed_forward.rs (16 tokens; batch 1, 8, 64), so the
numbers sit beside candle's and sentence-transformers' in BENCHMARKS.md ("A real embedding
model": kernel choice). Not part of abe or its tests.

Two steps, two venvs (torch for the export, onnxruntime for the timing):

  export  needs torch, transformers (tools/peers/infinity.sh's venv has both) and the onnx
          package (e.g. pip install --no-deps --target DIR onnx protobuf ml_dtypes, then
          PYTHONPATH=DIR):
            target/peers/infinity-venv/bin/python tools/bench/embed_ort.py export \\
                MODEL_DIR OUT.onnx
          writes the encoder (input_ids, attention_mask, token_type_ids -> last hidden
          state, batch and sequence axes dynamic) with torch.onnx's TorchScript exporter.
  time    needs onnxruntime and numpy only (python3 -m venv V; V/bin/pip install
          onnxruntime numpy):
            V/bin/python tools/bench/embed_ort.py time MODEL_DIR OUT.onnx [--threads 2]
          checks one pooled vector against sentence-transformers' in
          tests/fixtures/minilm_reference.json (cosine), then prints one JSON line per batch: median
          and min of --repeats calls.

The token ids (the bench sentence's, and the checked row's) are written by the export step
beside the .onnx file, so the timing venv needs no tokenizer.
"""
import argparse
import json
import os
import statistics
import sys
import time

FIXTURE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "fixtures", "minilm_reference.json"
)
SENTENCE = "The quick brown fox jumps over the lazy dog near the quiet river bank"


def export(model_dir, out):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    enc = tok([SENTENCE, SENTENCE], return_tensors="pt")
    assert enc["input_ids"].shape[1] == 16, "the bench sentence is 16 tokens"
    args = (enc["input_ids"], enc["attention_mask"], enc["token_type_ids"])
    names = ["input_ids", "attention_mask", "token_type_ids"]
    axes = {n: {0: "batch", 1: "seq"} for n in names}
    axes["last_hidden_state"] = {0: "batch", 1: "seq"}
    with torch.no_grad():
        torch.onnx.export(
            model,
            args,
            out,
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            dynamo=False,
        )
    # One reference row (sentence-transformers' vector) to check the exported graph by.
    ref = json.load(open(FIXTURE))["rows"][1]
    with open(out + ".ids.json", "w") as f:
        json.dump(
            {
                "bench": enc["input_ids"][0].tolist(),
                "check_ids": tok(ref["input"].strip())["input_ids"],
                "check_vector": ref["embedding"],
            },
            f,
        )
    print(f"wrote {out} ({os.path.getsize(out)} bytes) and {out}.ids.json", file=sys.stderr)


def time_ort(model_dir, onnx_path, threads, repeats):
    import numpy as np
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(onnx_path, opts, providers=["CPUExecutionProvider"])
    saved = json.load(open(onnx_path + ".ids.json"))

    def embed(batch, ids=saved["bench"]):
        input_ids = np.array([ids] * batch, dtype=np.int64)
        mask = np.ones_like(input_ids)
        types = np.zeros_like(input_ids)
        (hidden,) = sess.run(
            ["last_hidden_state"],
            {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": types},
        )
        m = mask[:, :, None].astype(np.float32)
        pooled = (hidden * m).sum(1) / np.clip(m.sum(1), 1e-9, None)
        return pooled / np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)

    v = embed(1, saved["check_ids"])[0]
    ref = np.array(saved["check_vector"], dtype=np.float32)
    cosine = float(v @ ref / np.linalg.norm(ref))
    print(
        json.dumps(
            {"onnxruntime": ort.__version__, "threads": threads, "cosine_vs_st": cosine}
        )
    )
    for batch in (1, 8, 64):
        for _ in range(3):
            embed(batch)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            embed(batch)
            times.append((time.perf_counter() - t) * 1e3)
        med = statistics.median(times)
        print(
            json.dumps(
                {
                    "batch": batch,
                    "median_ms": round(med, 2),
                    "min_ms": round(min(times), 2),
                    "per_request_ms": round(med / batch, 2),
                    "load1": float(open("/proc/loadavg").read().split()[0]),
                }
            )
        )


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("model_dir")
    e.add_argument("out")
    t = sub.add_parser("time")
    t.add_argument("model_dir")
    t.add_argument("onnx")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--repeats", type=int, default=10)
    a = p.parse_args()
    if a.cmd == "export":
        export(a.model_dir, a.out)
    else:
        time_ort(a.model_dir, a.onnx, a.threads, a.repeats)


if __name__ == "__main__":
    main()
