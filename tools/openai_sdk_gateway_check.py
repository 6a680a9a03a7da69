#!/usr/bin/env python3
"""What a gateway's tests see through the official OpenAI Python SDK when abe stands in for
vLLM (issue 26): failures by kind injected with POST /admin/faults (each raises the SDK's
exception for its status; a cut stream ends without [DONE]; a reset stream raises), and the
vLLM compatibilities (X-Request-Id, integer priority, /version, continuous usage stats), and
tools and structured output (tool_calls[0].function.arguments valid for the function's
parameters, whole and streamed; response_format json_schema; a clear 400), and the
Responses API (create, retrieve, stream, previous_response_id, text.format; tools are a
400 there for now), and LoRA adapters (loaded with vLLM's
POST /v1/load_lora_adapter, listed by models.list with their parent, served as a model,
unloaded).

Usage: [ABE_BATCHING_MODE=continuous] tools/openai_sdk_gateway_check.py http://127.0.0.1:PORT
(tools/with_server.sh starts abe with admin enabled and no token, as the default config
does). Leaves every fault off when it ends. Exits non-zero on the first surprise.
"""
import json
import sys
import urllib.request

import openai
from openai import OpenAI

OFF = {"rate_limited_rate": 0.0, "unauthorized_rate": 0.0, "context_length_rate": 0.0,
       "model_not_found_rate": 0.0, "internal_error_rate": 0.0, "unavailable_rate": 0.0,
       "stream_cut_rate": 0.0, "stream_reset_rate": 0.0, "stream_stall_rate": 0.0}


def check(cond, what):
    if not cond:
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"ok: {what}")


def faults(base, **kw):
    body = json.dumps({**OFF, **kw}).encode()
    req = urllib.request.Request(f"{base}/admin/faults", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def check_failures_by_kind(base, client):
    cases = [
        ("rate_limited_rate", openai.RateLimitError, 429),
        ("unauthorized_rate", openai.AuthenticationError, 401),
        ("context_length_rate", openai.BadRequestError, 400),
        ("model_not_found_rate", openai.NotFoundError, 404),
        ("internal_error_rate", openai.InternalServerError, 500),
        ("unavailable_rate", openai.InternalServerError, 503),
    ]
    for key, exc, status in cases:
        faults(base, **{key: 1.0}, retry_after_s=2)
        try:
            client.chat.completions.create(model="abe-sim", max_tokens=3,
                                           messages=[{"role": "user", "content": "hi"}])
            check(False, f"{key}: the SDK raises")
        except exc as err:
            check(err.status_code == status and err.response.headers.get("x-abe-fault"),
                  f"{key}: the SDK raises {exc.__name__} ({err.status_code})")
            if status == 429:
                check(err.response.headers.get("retry-after") == "2", "429 carries Retry-After")
            if status == 400:
                check("maximum context length" in str(err), "400 in vLLM's words")

    faults(base, stream_cut_rate=1.0, stream_after_chunks=2)
    chunks = list(client.completions.create(model="abe-sim", prompt="cut", max_tokens=8,
                                            stream=True))
    check(len(chunks) == 2 and all(c.choices[0].finish_reason is None for c in chunks),
          f"a cut stream: the SDK's iteration ends after 2 chunks, no finish ({len(chunks)})")

    faults(base, stream_reset_rate=1.0, stream_after_chunks=2)
    got = []
    try:
        for c in client.completions.create(model="abe-sim", prompt="reset", max_tokens=8,
                                           stream=True):
            got.append(c)
        check(False, "a reset stream raises")
    except Exception as err:  # the SDK's APIError or its HTTP client's read error
        check(len(got) <= 2, f"a reset stream raises {type(err).__name__} after {len(got)} chunks")

    faults(base, stream_stall_rate=1.0, stream_after_chunks=2, stream_stall_ms=200)
    text = "".join(c.choices[0].text for c in client.completions.create(
        model="abe-sim", prompt="stall", max_tokens=5, stream=True) if c.choices)
    check(len(text.split()) == 5, "a stalled stream completes after its stall")
    faults(base)


def check_vllm_extras(base, client):
    raw = client.completions.with_raw_response.create(
        model="abe-sim", prompt="hi", max_tokens=2, extra_headers={"X-Request-Id": "gw-42"})
    c = raw.parse()
    check(raw.headers.get("x-request-id") == "gw-42" and c.id == "cmpl-gw-42",
          f"X-Request-Id echoed and used as the id ({c.id})")
    for p in (-20, -1, 0, 3):
        c = client.completions.create(model="abe-sim", prompt="p", max_tokens=2,
                                      extra_body={"priority": p})
        check(c.usage.completion_tokens == 2, f"integer priority {p} served")
    usage = [ch.usage for ch in client.chat.completions.create(
        model="abe-sim", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True,
        stream_options={"include_usage": True, "continuous_usage_stats": True})]
    check(all(u is not None for u in usage) and usage[-1].completion_tokens == 4,
          "continuous_usage_stats: usage in every chunk, parsed by the SDK")
    with urllib.request.urlopen(f"{base}/version", timeout=10) as r:
        check("version" in json.load(r), "GET /version")


WEATHER = {"type": "object", "properties": {"city": {"type": "string"},
                                          "days": {"type": "integer", "minimum": 1, "maximum": 7}},
           "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}}]


def valid_weather(args):
    return (set(args) == {"city", "days"} and isinstance(args["city"], str)
            and isinstance(args["days"], int) and 1 <= args["days"] <= 7)


def check_tools_and_structured(client):
    msgs = [{"role": "user", "content": "weather in Lyon?"}]
    for choice in ("auto", "required", {"type": "function", "function": {"name": "get_weather"}}):
        r = client.chat.completions.create(model="abe-sim", messages=msgs, tools=TOOLS,
                                           tool_choice=choice)
        call = r.choices[0].message.tool_calls[0]
        args = json.loads(call.function.arguments)
        check(call.function.name == "get_weather" and valid_weather(args)
              and r.choices[0].finish_reason == "tool_calls",
              f"tool_choice {choice}: the SDK parses tool_calls[0].function.arguments ({args})")
    calls = {}
    for chunk in client.chat.completions.create(model="abe-sim", messages=msgs, tools=TOOLS,
                                                stream=True):
        for d in chunk.choices[0].delta.tool_calls or []:
            c = calls.setdefault(d.index, {"name": "", "arguments": ""})
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
    check(calls and valid_weather(json.loads(calls[0]["arguments"])),
          f"streamed tool-call deltas add up to valid arguments ({calls})")
    r = client.chat.completions.create(
        model="abe-sim", messages=msgs,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}})
    check(valid_weather(json.loads(r.choices[0].message.content)),
          "response_format json_schema: the content is valid JSON for the schema")
    try:
        client.chat.completions.create(model="abe-sim", messages=msgs, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {
                "type": "string", "pattern": "^[0-9]+$"}}})
        check(False, "an unsatisfiable schema is refused")
    except openai.BadRequestError as err:
        check("pattern" in str(err), "an unsatisfiable schema is a 400 saying why")


def check_responses(client):
    r = client.responses.create(model="abe-sim", input="tell me a story", max_output_tokens=6)
    check(len(r.output_text.split()) == 6 and r.usage.output_tokens == 6,
          f"responses.create: output_text and usage parse ({r.output_text!r})")
    again = client.responses.retrieve(r.id)
    check(again.id == r.id and again.output_text == r.output_text,
          "responses.retrieve: the stored response comes back")
    types, deltas, final = [], "", None
    for ev in client.responses.create(model="abe-sim", input=[{"role": "user", "content": "hi"}],
                                      instructions="Be brief.", max_output_tokens=4, stream=True):
        types.append(ev.type)
        if ev.type == "response.output_text.delta":
            deltas += ev.delta
        if ev.type in ("response.completed", "response.incomplete"):
            final = ev.response
    check(types[0] == "response.created" and final is not None and final.output_text == deltas,
          f"responses stream: the SDK's typed events, deltas add up ({len(types)} events)")
    nxt = client.responses.create(model="abe-sim", input="and then?", max_output_tokens=3,
                                  previous_response_id=r.id)
    alone = client.responses.create(model="abe-sim", input="and then?", max_output_tokens=3)
    check(nxt.previous_response_id == r.id
          and nxt.usage.input_tokens > alone.usage.input_tokens + r.usage.output_tokens // 2,
          f"previous_response_id: the stored conversation comes first "
          f"({nxt.usage.input_tokens} input tokens, {alone.usage.input_tokens} without)")
    try:
        client.responses.create(model="abe-sim", input="x", previous_response_id="resp_nope")
        check(False, "an unknown previous_response_id is a 404")
    except openai.NotFoundError:
        check(True, "an unknown previous_response_id is a 404 (the SDK's NotFoundError)")
    schema = {"type": "object", "properties": {"city": {"type": "string"},
              "days": {"type": "integer", "minimum": 1, "maximum": 7}},
              "required": ["city", "days"], "additionalProperties": False}
    j = client.responses.create(model="abe-sim", input="weather?", text={"format": {
        "type": "json_schema", "name": "w", "schema": schema, "strict": True}})
    out = json.loads(j.output_text)
    check(set(out) == {"city", "days"} and isinstance(out["city"], str)
          and 1 <= out["days"] <= 7 and j.text.format.type == "json_schema",
          f"text.format json_schema: the output text is the schema's JSON ({j.output_text})")
    try:
        client.responses.create(model="abe-sim", input="x", tools=[{
            "type": "function", "name": "f", "parameters": {"type": "object"}}])
        check(False, "tools in responses.create are refused, not ignored")
    except openai.BadRequestError as err:
        check("tools" in str(err), "tools in responses.create: a clear 400 (not built yet)")


def post(base, path, body):
    req = urllib.request.Request(f"{base}{path}", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status, r.read().decode()


def check_lora(base, client):
    status, text = post(base, "/v1/load_lora_adapter",
                        {"lora_name": "sdk-lora", "lora_path": "/adapters/sdk"})
    check(status == 200 and "added successfully" in text, f"load_lora_adapter: {text}")
    cards = {m.id: m for m in client.models.list()}
    card = cards.get("sdk-lora")
    check(card is not None and getattr(card, "parent", None) == "abe-sim"
          and getattr(card, "root", None) == "/adapters/sdk",
          "models.list shows the adapter with its parent and root")
    c = client.completions.create(model="sdk-lora", prompt="adapter", max_tokens=3)
    check(c.model == "sdk-lora" and c.usage.completion_tokens == 3,
          "a completion with model=<adapter> is served under the adapter's name")
    r = client.chat.completions.create(model="sdk-lora", max_tokens=2,
                                       messages=[{"role": "user", "content": "hi"}])
    check(r.model == "sdk-lora" and r.choices[0].message.content, "and a chat completion")
    status, text = post(base, "/v1/unload_lora_adapter", {"lora_name": "sdk-lora"})
    check(status == 200 and "removed successfully" in text, f"unload_lora_adapter: {text}")
    check("sdk-lora" not in {m.id for m in client.models.list()}, "gone from models.list")
    try:
        client.completions.create(model="sdk-lora", prompt="gone", max_tokens=2)
        check(False, "an unloaded adapter is a 404")
    except openai.NotFoundError:
        check(True, "an unloaded adapter is a 404 (the SDK's NotFoundError)")


def main():
    base = sys.argv[1].rstrip("/")
    client = OpenAI(base_url=base + "/v1", api_key="not-needed", max_retries=0, timeout=30)
    check_failures_by_kind(base, client)
    check_vllm_extras(base, client)
    check_tools_and_structured(client)
    check_responses(client)
    check_lora(base, client)
    print("openai sdk gateway check: all passed")


if __name__ == "__main__":
    main()
