"""Seeded fuzzing of the completion endpoints: thousands of generated and
mutated bodies, none of which may get a 5xx, and the server must still
answer afterwards. Bodies are kept to 1-2 generated tokens, so the cost is
the HTTP round trip; most are refused by validation anyway."""

import json
import random

import httpx
import openai
import pytest

from llmctl.bench.launcher import Server

SEED = 20240611
N_BODIES = 2000
MSG = [{"role": "user", "content": "Hi"}]

FIELDS = ["model", "messages", "prompt", "stream", "stream_options", "temperature", "top_p",
          "top_k", "min_p", "presence_penalty", "frequency_penalty", "repeat_penalty", "seed",
          "ignore_eos", "max_tokens", "max_completion_tokens", "stop", "n", "best_of", "tools",
          "tool_choice", "logprobs", "top_logprobs", "logit_bias", "echo", "suffix",
          "response_format", "user", "metadata", "x-unknown"]
STRINGS = ["", "smollm2", "hi", "é中文🙂", "\x00", "a" * 5000, "<|im_start|>", "{{ 7*7 }}",
           "\ud800", "text", "user", "assistant", "NaN"]
NUMBERS = [0, 1, 2, -1, 3, 2**31, 2**63, -(2**63), 10**30, 0.0, 0.5, 1.0, -0.0, 1e-320,
           1e308, -1e308, 2.5, 100]


def value(rng: random.Random, depth: int = 0):
    """A random JSON value, now and then a nasty one."""
    kind = rng.randrange(8 if depth < 3 else 5)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice(NUMBERS)
    if kind in (3, 4):
        return rng.choice(STRINGS)
    if kind == 5:
        return [value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 6:
        return {rng.choice(["type", "text", "role", "content", "include_usage", "k"]):
                value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return rng.choice([MSG, [{"role": "user", "content": [{"type": "text", "text": "x"}]}],
                       [{"role": value(rng, 3), "content": value(rng, 3)}]])


def mutate(rng: random.Random, body: dict) -> dict:
    body = dict(body)
    for _ in range(rng.randrange(1, 4)):
        key = rng.choice(FIELDS)
        if rng.random() < 0.15:
            body.pop(key, None)
        else:
            body[key] = value(rng)
    # Whatever the mutation, a body that passes validation generates 1-2 tokens.
    if type(body.get("max_completion_tokens")) is int and body["max_completion_tokens"] > 2:
        body["max_completion_tokens"] = 2
    if body.get("max_completion_tokens") is None and (
            body.get("max_tokens") is None
            or (type(body["max_tokens"]) is int and body["max_tokens"] > 2)):
        body["max_tokens"] = rng.choice([1, 2])
    return body


def encode(rng: random.Random, body: dict) -> bytes:
    raw = json.dumps(body, ensure_ascii=rng.random() < 0.5).encode("utf-8", "surrogatepass")
    if rng.random() < 0.15:   # byte-level damage: mostly invalid JSON
        pos = rng.randrange(len(raw) + 1)
        junk = rng.choice([b"", b"\xff", b"NaN", b"[", b"}", b'"', b"\\u", b"1e999", b"\x00"])
        raw = raw[:pos] + junk + raw[pos + rng.randrange(3):]
    return raw


@pytest.fixture(scope="module")
def server(session_home):
    # One thread: a 1-token answer stays quick on a busy 2-core machine.
    with Server.llmctl_serve("smollm2", "--ctx-size", "256", "--max-num-seqs", "1",
                             "--threads", "1", "--no-prefix-cache",
                             env={"LLMCTL_HOME": str(session_home)}) as srv:
        yield srv


@pytest.mark.slow
def test_fuzzed_bodies_never_get_a_5xx(server):
    rng = random.Random(SEED)
    bases = {"/v1/chat/completions": {"messages": MSG, "max_tokens": 1},
             "/v1/completions": {"prompt": "Hi", "max_tokens": 1}}
    failures, statuses = [], {}
    with httpx.Client(base_url=server.url, timeout=60,
                      headers={"content-type": "application/json"}) as http:
        for _ in range(N_BODIES):
            path = rng.choice(list(bases))
            raw = encode(rng, mutate(rng, bases[path]))
            try:
                r = http.post(path, content=raw)
            except httpx.TransportError as e:   # a crash or a dropped connection
                failures.append((path, raw[:300], type(e).__name__, str(e)))
                continue
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
            if r.status_code >= 500:
                failures.append((path, raw[:300], r.status_code, r.text[:300]))
    print(f"\nfuzz: {N_BODIES} bodies tried, statuses {dict(sorted(statuses.items()))}")
    assert not failures, "\n".join(map(repr, failures[:10]))
    assert statuses.get(200) and statuses.get(400)   # both paths were really exercised
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=4)
    assert r.choices[0].message.content and r.usage.completion_tokens >= 1


# --- schema mode: generated JSON Schemas through all three ways in ----------

N_SCHEMAS = 1002            # a third each as response_format, tool parameters, Ollama format
SCHEMA_BATCH = 50
PLAIN_CHAT_S = 10.0         # the bound on a plain chat after each batch
SCHEMA_TIMEOUT_S = 60.0     # a hang fails the test instead of the suite


@pytest.fixture(scope="module")
def schema_server(session_home):
    # A short stall window, so a wedged engine shows on /health within a batch.
    with Server.llmctl_serve("smollm2", "--ctx-size", "2048", "--max-num-seqs", "2",
                             "--threads", "1", "--no-prefix-cache",
                             env={"LLMCTL_HOME": str(session_home),
                                  "LLMCTL_ENGINE_STALL_S": "5"}) as srv:
        yield srv


def schema_request(i: int, schema) -> tuple[str, dict]:
    """Schema I sent one of the three ways, with a few tokens to generate so
    the grammar really constrains sampling."""
    msgs = [{"role": "user", "content": "Answer in JSON."}]
    if i % 3 == 0:
        return "/v1/chat/completions", {
            "messages": msgs, "max_tokens": 8, "temperature": 0,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "s", "schema": schema}}}
    if i % 3 == 1:
        return "/v1/chat/completions", {
            "messages": msgs, "max_tokens": 8, "temperature": 0, "tool_choice": "required",
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}
    return "/api/chat", {"messages": msgs, "stream": False, "format": schema,
                         "options": {"num_predict": 8, "temperature": 0}}


def plain_chat_answers(http: httpx.Client) -> str | None:
    """None when a plain chat answers within PLAIN_CHAT_S, else why not."""
    try:
        r = http.post("/v1/chat/completions", timeout=PLAIN_CHAT_S,
                      json={"messages": MSG, "max_tokens": 2})
    except httpx.TransportError as e:
        return f"{type(e).__name__}: {e}"
    return None if r.status_code == 200 else f"{r.status_code}: {r.text[:200]}"


@pytest.mark.slow
def test_fuzzed_schemas_never_wedge_or_5xx(schema_server):
    from test_grammar_limits import gen_schema

    rng = random.Random(SEED)
    failures, statuses = [], {}
    with httpx.Client(base_url=schema_server.url, timeout=SCHEMA_TIMEOUT_S) as http:
        for start in range(0, N_SCHEMAS, SCHEMA_BATCH):
            for i in range(start, min(start + SCHEMA_BATCH, N_SCHEMAS)):
                schema = gen_schema(rng)
                path, body = schema_request(i, schema)
                try:
                    r = http.post(path, json=body)
                except httpx.TransportError as e:
                    failures.append((path, json.dumps(schema)[:300], type(e).__name__))
                    continue
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1
                if r.status_code >= 500:
                    failures.append((path, json.dumps(schema)[:300], r.status_code, r.text[:300]))
            why = plain_chat_answers(http)
            health = http.get("/health", timeout=PLAIN_CHAT_S)
            if why is not None:
                failures.append(("plain chat after batch", start, why, health.status_code,
                                 health.text[:200]))
                assert health.status_code != 200, "/health says ok while chat makes no progress"
                break
    print(f"\nschema fuzz: {N_SCHEMAS} schemas, statuses {dict(sorted(statuses.items()))}")
    assert not failures, "\n".join(map(repr, failures[:10]))
    # Both outcomes were exercised: schemas that constrain answers and refusals.
    assert statuses.get(200, 0) >= N_SCHEMAS // 10 and statuses.get(400, 0) >= 10
