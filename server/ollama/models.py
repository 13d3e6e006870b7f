"""Ollama's model routes: /api/tags (the store), /api/ps (the pool),
/api/show (one model's metadata), /api/embed and /api/version."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path

from fastapi import APIRouter, Request

from llmctl import __version__
from llmctl.errors import InvalidParams, LlmctlError
from llmctl.runtime.formats.reasoning import THINK_OPEN
from llmctl.runtime.formats.template import ChatTemplate
from llmctl.runtime.llm import LLM
from llmctl.runtime.pool.model_pool import Loaded
from llmctl.server.body import json_body
from llmctl.server.fields import typed_field
from llmctl.server.model_names import resolve_request
from llmctl.server.ollama.request import (
    OllamaRoute,
    far_future,
    ns,
    parse_options,
    rfc3339,
)
from llmctl.server.state import state_of
from llmctl.server.workers import run_on
from llmctl.store.gguf_info import read_gguf_info
from llmctl.store.index import StoreIndex
from llmctl.store.resolve import ResolvedModel

router = APIRouter(route_class=OllamaRoute)


def human_number(n: int) -> str:
    """A parameter count as Ollama writes it: 135M -> "134.52M", 7.6e9 -> "7.6B"."""
    for scale, unit, digits in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{digits}f}{unit}"
    return f"{n / 1e3:.0f}K" if n >= 1000 else str(n)


def _details(architecture: str, parameters: int, quant: str) -> dict:
    return {"parent_model": "", "format": "gguf", "family": architecture,
            "families": [architecture], "parameter_size": human_number(parameters),
            "quantization_level": quant}


def _listing(resolved: ResolvedModel) -> dict:
    """/api/tags' entry for a model: from its store entry when it has one
    (no file read), else from its GGUF header."""
    entry = resolved.entry
    if entry is not None:
        details = _details(entry.architecture, entry.parameters, entry.quant)
        size, digest, modified = entry.size, entry.sha256, entry.added
    else:
        info = read_gguf_info(resolved.path)
        details = _details(info.architecture, info.parameters, info.quant)
        size, digest, modified = info.size, "", resolved.path.stat().st_mtime
    return {"name": resolved.name, "model": resolved.name, "modified_at": rfc3339(modified),
            "size": size, "digest": digest or "", "details": details}


def _local_models(named: list[ResolvedModel], presets: dict[str, str]) -> list[dict]:
    """Every model in the store whose file is there, and those given on the
    command line, each once; then each preset (name -> its model) whose
    model is among them, as that model under the preset's name."""
    found = {e.name: ResolvedModel(e.name, Path(e.path), entry=e)
             for e in StoreIndex().list() if Path(e.path).is_file()}
    for resolved in named:
        found.setdefault(resolved.name, resolved)
    listings = {name: _listing(r) for name, r in found.items()}
    for preset, model in presets.items():
        if model in listings:
            base = listings[model]
            listings.setdefault(preset, {**base, "name": preset, "model": preset,
                                         "details": {**base["details"], "parent_model": model}})
    return list(listings.values())


@router.get("/api/tags")
async def tags(request: Request):
    """GET /api/tags: the models in the store and those on the command line,
    and the presets over them, in Ollama's shape."""
    state = state_of(request)
    named = [state.pool.resolve(name) for name in state.pool.named()]
    presets = {name: p.model for name, p in state.presets.items()}
    return {"models": await run_on(state.workers.query, _local_models, named, presets)}


def _running(entry: Loaded, llm: LLM) -> dict:
    """/api/ps' entry for a loaded model, with llmctl's own figures under
    "llmctl" (what `llmctl ps` shows)."""
    now = time.time()
    listing = _listing(entry.resolved)
    expires = _expiry(entry, now)
    stats = llm.stats()
    return {"name": entry.name, "model": entry.name, "size": entry.bytes,
            "digest": listing["digest"], "details": listing["details"], "expires_at": expires,
            "size_vram": 0, "context_length": llm.n_ctx,
            "llmctl": {"requests_active": entry.active, "slots": llm.opts.max_num_seqs,
                       "slots_running": stats.running, "keep_alive_s": entry.keep_alive_s,
                       "idle_s": 0.0 if entry.active else round(now - entry.last_used, 3),
                       "loaded_at": rfc3339(entry.loaded_at),
                       "n_gpu_layers": llm.n_gpu_layers}}


def _expiry(entry: Loaded, now: float) -> str:
    """When `entry` unloads, as Ollama writes it: far_future() for a model
    kept forever, and for any time past what a datetime can hold (the pool
    caps keep_alive, but a listing must never fail on one)."""
    if entry.keep_alive_s < 0:
        return far_future()
    when = entry.expires_at or now + entry.keep_alive_s    # in use: a keep-alive from now
    try:
        return rfc3339(when)
    except (OverflowError, OSError, ValueError):
        return far_future()


@router.get("/api/ps")
async def ps(request: Request):
    """GET /api/ps: the loaded models in Ollama's shape, with llmctl's figures."""
    state = state_of(request)
    loaded = [(e, e.llm) for e in state.pool.loaded() if e.llm is not None]
    queue = state.admission.view()
    models = await run_on(state.workers.query, lambda: [_running(e, llm) for e, llm in loaded])
    for m in models:
        m["llmctl"]["queued"] = queue.by_model.get(m["name"], 0)
    return {"models": models, "llmctl": {"queue": queue.as_dict()}}


@router.get("/api/version")
async def version():
    """GET /api/version: llmctl's version."""
    return {"version": __version__}


def _model_name(body: dict) -> str:
    # `name` is the field's older spelling, still sent by some clients.
    name = typed_field(body, "model", (str,)) or typed_field(body, "name", (str,))
    if not name:
        raise InvalidParams("'model' is required", param="model")
    return name


def _capabilities(template: str | None) -> list[str]:
    caps = ["completion"]
    try:
        if ChatTemplate(template).supports_tools:
            caps.append("tools")
    except LlmctlError:
        pass                    # a broken template: plain completion is all that is sure
    if template and THINK_OPEN in template:
        caps.append("thinking")
    return caps


def _show(resolved: ResolvedModel, defaults, n_ctx: int | None) -> dict:
    """`n_ctx`: the context the model is loaded with; None when it is not."""
    info = read_gguf_info(resolved.path)
    arch = info.architecture
    template = resolved.template or info.chat_template or ""
    params = {"temperature": defaults.temperature, "top_k": defaults.top_k,
              "top_p": defaults.top_p, "min_p": defaults.min_p,
              "repeat_penalty": defaults.repeat_penalty, "num_ctx": n_ctx or resolved.context}
    parameters = "\n".join(f"{k:<30} {v}" for k, v in params.items() if v is not None)
    model_info = {"general.architecture": arch, "general.name": info.name,
                  "general.parameter_count": info.parameters,
                  f"{arch}.context_length": info.context_length,
                  f"{arch}.block_count": info.n_layers,
                  f"{arch}.embedding_length": info.n_embd,
                  f"{arch}.attention.head_count": info.n_head,
                  f"{arch}.attention.head_count_kv": info.n_head_kv,
                  f"{arch}.attention.key_length": info.head_dim}
    return {"modelfile": f"# Modelfile generated by llmctl\nFROM {resolved.path}\n",
            "parameters": parameters, "template": template,
            "details": _details(arch, info.parameters, info.quant), "model_info": model_info,
            "capabilities": _capabilities(template),
            "modified_at": _listing(resolved)["modified_at"]}


@router.post("/api/show")
async def show(request: Request):
    """POST /api/show: one model's template, parameters and GGUF metadata.
    Answers 400 without a model name and 404 (ModelNotFound) for an unknown one."""
    state = state_of(request)
    name = _model_name(await json_body(request))
    preset = state.preset(name)
    resolved = await run_on(state.workers.resolve, resolve_request, state.pool,
                            state.model_of(name))
    entry = state.pool.get(resolved.name)
    n_ctx = entry.llm.n_ctx if entry is not None and entry.llm is not None else None
    if preset is None:
        return await run_on(state.workers.query, _show, resolved, state.defaults, n_ctx)
    shown = replace(resolved, template=preset.template or resolved.template)
    body = await run_on(state.workers.query, _show, shown, preset.params(state.defaults), n_ctx)
    return {**body, "system": preset.system or ""}


def _texts(value) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(t, str) for t in value):
        return value
    raise InvalidParams("'input' must be a string or a list of strings", param="input")


@router.post("/api/embed")
async def embed(request: Request):
    """POST /api/embed: embeddings of `input` (a string or strings), in Ollama's
    shape. Answers 400 (InvalidParams) for a bad field or option, and what
    ServerState.lease and embed_texts raise."""
    from llmctl.runtime.embed import embed_texts
    from llmctl.server.watch import embed_watched

    start = time.monotonic()
    state = state_of(request)
    body = await json_body(request)
    texts = _texts(body.get("input", []))
    truncate = typed_field(body, "truncate", (bool,))
    dimensions = typed_field(body, "dimensions", (int,))
    parse_options(body.get("options"), state.defaults)   # refuses what it cannot honour
    model = typed_field(body, "model", (str,)) or None
    with await state.lease(model, body.get("keep_alive")) as lease:
        load_s = time.monotonic() - start
        # Stopped between batches if the client hangs up.
        vectors, n_prompt = ([], 0) if not texts else await embed_watched(
            request, embed_texts, lease.llm, texts, truncate=truncate is not False,
            dimensions=dimensions)
    return {"model": model or lease.name, "embeddings": vectors,
            "total_duration": ns(time.monotonic() - start), "load_duration": ns(load_s),
            "prompt_eval_count": n_prompt}


@router.post("/api/embeddings")
async def embeddings_legacy(request: Request):
    """Ollama's older route: one `prompt`, one `embedding` (empty for an
    empty prompt), with the same cancellation and limits as /api/embed."""
    from llmctl.runtime.embed import embed_texts
    from llmctl.server.watch import embed_watched

    state = state_of(request)
    body = await json_body(request)
    prompt = typed_field(body, "prompt", (str,)) or ""
    parse_options(body.get("options"), state.defaults)
    model = typed_field(body, "model", (str,)) or None
    with await state.lease(model, body.get("keep_alive")) as lease:
        vectors, _ = ([[]], 0) if not prompt else await embed_watched(
            request, embed_texts, lease.llm, [prompt])
    return {"embedding": vectors[0]}

