"""The README's tool-calling transcript, reproducible: a tool round trip and
a json_schema answer through the official openai client.

    ./scripts/llmctl serve qwen2.5-coder-0.5b --port 8000 &
    .venv/bin/python scripts/demo_tools.py --url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import json

import openai

MODEL = "qwen2.5-coder-0.5b"
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
PLACE = {"type": "object", "properties": {"city": {"type": "string"},
                                          "country": {"type": "string"}},
         "required": ["city", "country"], "additionalProperties": False}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000/v1")
    c = openai.OpenAI(base_url=ap.parse_args().url, api_key="unused")
    msgs = [{"role": "user", "content": "What's the weather in Paris?"}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS,
                                  tool_choice="required", temperature=0)
    m = r.choices[0].message
    print("finish_reason:", r.choices[0].finish_reason)
    print(json.dumps([t.model_dump() for t in m.tool_calls]))
    msgs += [m.model_dump(exclude_none=True),
             {"role": "tool", "tool_call_id": m.tool_calls[0].id,
              "content": '{"temp_c": 21, "sky": "clear"}'}]
    r = c.chat.completions.create(model=MODEL, messages=msgs, tools=TOOLS, temperature=0)
    print("finish_reason:", r.choices[0].finish_reason)
    print(r.choices[0].message.content)
    r = c.chat.completions.create(
        model=MODEL, temperature=0,
        messages=[{"role": "user", "content": "Give me a city and its country."}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "place", "strict": True, "schema": PLACE}})
    print(r.choices[0].message.content)


if __name__ == "__main__":
    main()
