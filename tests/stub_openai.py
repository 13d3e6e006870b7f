"""A stub OpenAI-compatible server that streams tokens at a known pace, for
testing `llmctl bench`. Run as a script (the tests start it through
llmctl.bench.launcher.Server, which adds --port):

  python tests/stub_openai.py --ttft 0.1 --itl 0.02 --port PORT [--fail-every K]
      [--tokenize] [--reject-ignore-eos] [--api-key KEY]

Each request is paced on its own clock (as if the server had unlimited
parallelism), so measured timings should match the pace at any concurrency.
Tokens are whitespace-led words; BOS counts as one prompt token."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import sys
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

WORD = re.compile(r"\s*\S+")
EOS_AFTER = 3   # tokens a "model" writes before its EOS, unless ignore_eos


def make_app(ttft: float, itl: float, fail_every: int, tokenize: bool,
             reject_ignore_eos: bool, api_key: str | None) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def auth(request: Request, call_next):
        guarded = request.url.path.startswith(("/v1", "/tokenize", "/detokenize"))
        if api_key and guarded and request.headers.get("authorization") != f"Bearer {api_key}":
            return JSONResponse({"error": {"message": "invalid api key"}}, 401)
        return await call_next(request)
    vocab: dict[str, int] = {"<bos>": 0}
    pieces: list[str] = ["<bos>"]
    stats = {"requests": 0, "in_flight": 0, "max_in_flight": 0, "prompts": [],
             "ignore_eos": 0}

    def encode(text: str) -> list[int]:
        ids = [0]
        for piece in WORD.findall(text):
            if piece not in vocab:
                vocab[piece] = len(pieces)
                pieces.append(piece)
            ids.append(vocab[piece])
        return ids

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "stub-model", "object": "model"}]}

    @app.get("/stats")
    async def get_stats():
        return {**stats, "distinct_prompts": len(set(stats["prompts"]))}

    @app.post("/reset")
    async def reset():
        stats.update(requests=0, max_in_flight=0, prompts=[], ignore_eos=0)
        return {}

    if tokenize:
        @app.post("/tokenize")
        async def tok(req: Request):
            body = await req.json()
            ids = encode(body["content"])
            return {"tokens": ids if body.get("add_special") else ids[1:]}

        @app.post("/detokenize")
        async def detok(req: Request):
            return {"content": "".join(pieces[i] for i in (await req.json())["tokens"] if i)}

    @app.post("/v1/completions")
    async def completions(req: Request):
        body = await req.json()
        if reject_ignore_eos and "ignore_eos" in body:
            return JSONResponse({"error": {"message": "unknown field ignore_eos"}}, 400)
        stats["requests"] += 1
        if fail_every and stats["requests"] % fail_every == 0:
            return JSONResponse({"error": {"message": "stub failure"}}, 500)
        stats["prompts"].append(body["prompt"])
        stats["ignore_eos"] += bool(body.get("ignore_eos"))
        n_prompt = len(encode(body["prompt"]))
        n_out = body["max_tokens"] if body.get("ignore_eos") else min(EOS_AFTER,
                                                                       body["max_tokens"])
        usage = (body.get("stream_options") or {}).get("include_usage")
        return StreamingResponse(stream(n_prompt, n_out, usage), media_type="text/event-stream")

    async def stream(n_prompt: int, n_out: int, usage: bool):
        t0 = time.perf_counter()
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        try:
            for i in range(n_out):
                # Absolute deadlines, so sleep overshoot does not accumulate.
                delay = t0 + ttft + i * itl - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                chunk = {"object": "text_completion", "model": "stub-model",
                         "choices": [{"index": 0, "text": f" w{i}", "finish_reason": None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            if usage:
                u = {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                     "total_tokens": n_prompt + n_out}
                yield f"data: {json.dumps({'choices': [], 'usage': u})}\n\n"
            yield "data: [DONE]\n\n"
        finally:
            stats["in_flight"] -= 1

    return app


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ttft", type=float, default=0.1)
    p.add_argument("--itl", type=float, default=0.02)
    p.add_argument("--fail-every", type=int, default=0)
    p.add_argument("--tokenize", action="store_true")
    p.add_argument("--reject-ignore-eos", action="store_true")
    p.add_argument("--api-key")
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted sockets inherit this on Linux; without it, Nagle plus delayed
    # ACKs add 40 ms to every small response on a kept-alive connection.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", a.port))
    app = make_app(a.ttft, a.itl, a.fail_every, a.tokenize, a.reject_ignore_eos, a.api_key)
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    sys.exit(main())
