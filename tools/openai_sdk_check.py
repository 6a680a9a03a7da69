#!/usr/bin/env python3
"""Drive a running abe with the official OpenAI Python SDK: models, completions,
embeddings (float and the SDK's default base64), and an error. In continuous batching
(ABE_BATCHING_MODE=continuous, as tools/test.sh starts the server) with prefix caching on
(the default; ABE_CONTINUOUS_PREFIX_CACHING=false turns it off), a repeated prompt's
usage.prompt_tokens_details.cached_tokens parses through the SDK and is > 0; otherwise the
field is absent.

Usage: [ABE_BATCHING_MODE=continuous] tools/openai_sdk_check.py http://127.0.0.1:PORT
Exits non-zero with a message on the first thing that is not as a client expects.
"""
import math
import os
import sys

import openai
from openai import OpenAI


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def check_prefix_cache(client):
    """A repeated ~2,000-byte prompt (500 tokens) hits the prefix cache in continuous
    batching: whole 16-token blocks, all but the one holding the last token."""
    continuous = os.environ.get("ABE_BATCHING_MODE", "request") == "continuous"
    caching = os.environ.get("ABE_CONTINUOUS_PREFIX_CACHING", "true").lower() != "false"
    prompt = "".join(f"Line {i}: the river carries stones past the mill. " for i in range(60))[:2000]
    first = client.completions.create(model="abe-sim", prompt=prompt, max_tokens=2)
    again = client.completions.create(model="abe-sim", prompt=prompt, max_tokens=2)
    details = again.usage.prompt_tokens_details
    if not (continuous and caching):
        check(details is None, "no prefix cache: usage.prompt_tokens_details absent")
        return
    check(first.usage.prompt_tokens_details is not None
          and first.usage.prompt_tokens_details.cached_tokens == 0,
          "prefix cache: a new prompt has cached_tokens 0")
    cached = details.cached_tokens if details is not None else None
    check(isinstance(cached, int) and 0 < cached < again.usage.prompt_tokens and cached % 16 == 0,
          f"prefix cache: a repeated prompt's cached_tokens parses and is > 0 ({cached} "
          f"of {again.usage.prompt_tokens})")
    usage = None
    for chunk in client.completions.create(model="abe-sim", prompt=prompt, max_tokens=2,
                                           stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
    streamed = usage.prompt_tokens_details.cached_tokens if usage and usage.prompt_tokens_details else None
    check(streamed == cached, f"prefix cache: the streamed usage chunk says so too ({streamed})")


def main():
    base = sys.argv[1].rstrip("/") + "/v1"
    client = OpenAI(base_url=base, api_key="not-needed", max_retries=0, timeout=30)

    models = client.models.list()
    ids = [m.id for m in models.data]
    check("abe-sim" in ids, f"models.list lists abe-sim ({ids})")

    c = client.completions.create(model="abe-sim", prompt="Say something", max_tokens=6)
    check(len(c.choices) == 1, "one choice for one prompt")
    check(len(c.choices[0].text.split()) == 6, "six tokens of text")
    check(c.choices[0].finish_reason == "length", "finish_reason length")
    check(c.usage.completion_tokens == 6, "usage.completion_tokens")
    check(c.usage.total_tokens == c.usage.prompt_tokens + 6, "usage.total_tokens")

    c = client.completions.create(model="abe-sim", prompt=["a", "b", "c"], max_tokens=2,
                                  extra_body={"priority": "high"})
    check([ch.index for ch in c.choices] == [0, 1, 2], "one choice per prompt, in order")

    chat = client.chat.completions.create(
        model="abe-sim",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        max_tokens=5,
    )
    check(chat.choices[0].message.role == "assistant", "chat: an assistant message")
    check(len(chat.choices[0].message.content.split()) == 5, "chat: five tokens")
    check(chat.usage.completion_tokens == 5, "chat: usage")

    pieces = []
    usage = None
    for chunk in client.chat.completions.create(
        model="abe-sim",
        messages=[{"role": "user", "content": "Stream, please"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
    check(len("".join(pieces).split()) == 4, f"chat stream: four tokens ({pieces})")
    check(usage is not None and usage.completion_tokens == 4, "chat stream: usage chunk")
    streamed = "".join(
        ch.choices[0].text
        for ch in client.completions.create(model="abe-sim", prompt="s", max_tokens=3, stream=True)
        if ch.choices
    )
    check(len(streamed.split()) == 3, "completion stream: three tokens")

    check_prefix_cache(client)

    # The SDK asks for base64 by default and decodes it to floats.
    e = client.embeddings.create(model="abe-sim", input=["hello", "world"])
    check(len(e.data) == 2, "two embeddings")
    norm = math.sqrt(sum(x * x for x in e.data[0].embedding))
    check(abs(norm - 1.0) < 1e-4, f"unit-norm embedding (norm {norm:.6f})")
    e2 = client.embeddings.create(model="abe-sim", input="hello", encoding_format="float",
                                  dimensions=16)
    check(len(e2.data[0].embedding) == 16, "dimensions honoured")
    e3 = client.embeddings.create(model="abe-sim", input="hello", dimensions=16)
    diff = max(abs(a - b) for a, b in zip(e2.data[0].embedding, e3.data[0].embedding))
    check(diff < 1e-6, "base64 and float encodings agree")

    try:
        client.completions.create(model="abe-sim", prompt="x", max_tokens=-5)
        check(False, "negative max_tokens is refused")
    except openai.BadRequestError as err:
        check("max_tokens" in str(err), "negative max_tokens gives a 400 naming the field")

    try:
        client.completions.create(model="no-such-model", prompt="x")
        check(False, "unknown model is refused")
    except openai.NotFoundError as err:
        check("no-such-model" in str(err), "unknown model gives a 404 naming it")

    print("openai sdk check: all passed")


if __name__ == "__main__":
    main()
