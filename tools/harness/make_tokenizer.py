#!/usr/bin/env python3
"""Writes a HuggingFace tokenizer directory for harnesses (aiperf, guidellm) that count
tokens themselves: one token per word of abe's synthetic vocabulary (read from
src/exec/synth.rs), whitespace-split, anything else [UNK]. With it a harness counts exactly
the tokens abe generated (abe's text is one vocabulary word per token), so its
inter-token latency divides by the same count abe's own metrics use, and nothing is
downloaded (no hub, no tiktoken files).

Usage: make_tokenizer.py OUT_DIR   (needs the `tokenizers` and `transformers` packages,
which aiperf installs)
"""
import pathlib
import re
import sys

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

root = pathlib.Path(__file__).resolve().parents[2]
synth = (root / "src/exec/synth.rs").read_text()
block = re.search(r"const VOCAB: &\[&str\] = &\[(.*?)\];", synth, re.S).group(1)
words = re.findall(r'"([^"]+)"', block)
vocab = {"[UNK]": 0}
for w in words:
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
out = pathlib.Path(sys.argv[1])
fast.save_pretrained(out)
print(f"tokenizer with {len(vocab)} tokens in {out}")
