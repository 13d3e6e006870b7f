"""The waiting side of ModelPool: a model's entry and a request's lease on
it, what a reservation answers, and the requests waiting for a model's
room, woken only when room may have appeared and only as many as could
then succeed.

A wake-up is not free: the server answers each one with a try on its query
workers, which /api/tags and /api/ps share. So the pool calls a waiter only
on an event that can change its answer (a model going idle, an unload, a
load ending or failing, an abandoned reservation, a waiter leaving), and of
the waiters for a model that is not loaded only the oldest, and only while
the room freed could hold it."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterable

from llmctl.errors import LlmctlError, ModelsBusy, ModelTooLarge

if TYPE_CHECKING:
    from llmctl.runtime.llm import LLM
    from llmctl.runtime.load_options import LoadOptions
    from llmctl.runtime.pool.model_pool import ModelPool
    from llmctl.store.resolve import ResolvedModel

log = logging.getLogger("llmctl.pool")

# A keep-alive that never runs out (Ollama's -1: any negative value).
FOREVER = -1.0

# Requests one model may have waiting for its room; past it, ModelsBusy (a
# 503 with Retry-After) at once instead of a wait with no bound on its cost.
WAITERS_MAX = 256


def waiters_max(setting: int | None, default: int = WAITERS_MAX) -> int:
    """The settings' model_waiters_max, else `default` (a server passes its
    queue bound: a request it admitted never gets turned away here for
    waiting)."""
    return setting or default


# llama.cpp's compute buffers and the engine's own arrays, beyond weights and KV.
OVERHEAD_BYTES = 64 << 20


def estimate_bytes(resolved: "ResolvedModel", opts: "LoadOptions") -> int:
    """Memory a model will hold once loaded: its weights, the KV cache of
    every slot at the context it will get (and of the splice context when
    cached runs may move), and a fixed overhead. Raises
    BadModelFile for a file that is not GGUF."""
    from llmctl.runtime import planner
    from llmctl.runtime.llm import DEFAULT_CTX
    from llmctl.store.gguf_info import read_gguf_info

    info = read_gguf_info(resolved.path)
    n_ctx = opts.ctx_size or min(resolved.context or DEFAULT_CTX,
                                 info.context_length or DEFAULT_CTX)
    shape = planner.ModelShape.from_info(info, opts.kv_type)
    # Moving cached runs keeps a side context of one sequence and its gap
    # margin once it has been used (runtime/llama/splice.py).
    seqs = opts.max_num_seqs + (1 if opts.prefix_cache and opts.move_cached_runs else 0)
    return info.size + shape.kv_bytes(n_ctx * seqs) + OVERHEAD_BYTES


@dataclass
class Loaded:
    """A model in the pool. `active`: requests using it now; it expires
    `keep_alive_s` after the last one ends (FOREVER: never). `unloading`:
    its engine is being closed; it still holds its room until it is gone."""

    name: str
    resolved: "ResolvedModel"
    bytes: int
    keep_alive_s: float
    llm: "LLM | None" = None         # once loaded
    error: BaseException | None = None
    active: int = 0
    last_used: float = 0.0
    loaded_at: float = 0.0
    unloading: bool = False

    @property
    def loading(self) -> bool:
        return self.llm is None and self.error is None

    @property
    def idle(self) -> bool:
        """Loaded, unused and not going away: an unload may take it."""
        return not self.active and not self.loading and not self.unloading

    @property
    def expires_at(self) -> float | None:
        """Wall-clock time it unloads if nothing uses it; None: never, or in use."""
        if self.active or self.keep_alive_s < 0:
            return None
        return self.last_used + self.keep_alive_s


@dataclass
class Reservation:
    """ModelPool.try_reserve's answer: `entry` with one use counted (to
    `fill` first when `fresh`), or None and `why` the caller must wait;
    `loading` is the entry being loaded by another request meanwhile."""

    entry: "Loaded | None"
    fresh: bool = False
    why: str = ""
    loading: "Loaded | None" = None

    def raise_failed(self) -> None:
        """After a wait: raise the error the load this waited for ended in."""
        if self.loading is not None and self.loading.error is not None:
            raise self.loading.error


class Lease:
    """One request's hold on a loaded model; `release()` (or leaving the
    `with`) lets the pool unload it again. Raises LlmctlError for an entry
    that is not loaded (the pool never asks for one)."""

    def __init__(self, pool: ModelPool, entry: Loaded):
        self.pool, self.entry = pool, entry
        if entry.llm is None:       # the pool leases loaded entries only
            raise LlmctlError(f"model {entry.name!r} is not loaded")
        self.llm: LLM = entry.llm
        self.name = entry.name
        self._released = False

    def release(self) -> None:
        """Give the model back to the pool, once; later calls do nothing."""
        if not self._released:
            self._released = True
            self.pool._release(self.entry)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


# What a model is, for its waiters: loaded (every waiter can take it), busy
# (loading or unloading: its end is the event to wait for), or absent (the
# waiter needs room for it).
LOADED, BUSY, ABSENT = "loaded", "busy", "absent"


@dataclass
class Room:
    """What the pool could give new models now: model slots and bytes,
    counting idle models as free (a reservation unloads them)."""

    slots: int
    bytes: int

    def take(self, need: int | None) -> bool:
        """Count one more model of `need` bytes (None: not yet known, so
        count it as taking all that is left); False when it does not fit."""
        if self.slots < 1 or (need is not None and need > self.bytes):
            return False
        self.slots -= 1
        self.bytes = 0 if need is None else self.bytes - need
        return True


def status_of(entry: Loaded | None) -> str:
    """LOADED, BUSY or ABSENT, for the waiters of `entry`'s model."""
    if entry is None:
        return ABSENT
    return BUSY if entry.loading or entry.unloading else LOADED


def room_now(models: Iterable[Loaded], models_max: int, budget: int) -> Room:
    """The room new models could have, idle models unloaded."""
    models = list(models)
    idle = [e for e in models if e.idle]
    return Room(models_max - len(models) + len(idle),
                budget - sum(e.bytes for e in models) + sum(e.bytes for e in idle))


def plan_room(models: Iterable[Loaded], need: int, models_max: int, budget: int
              ) -> tuple[str | None, list[Loaded]]:
    """The idle models to unload, least recently used first, for `need`
    bytes and a model slot to be free: (None, them) when that is enough,
    else (why the caller must wait, []), so nothing is unloaded in vain.
    Models being unloaded still hold their room. Raises ModelTooLarge
    when waiting cannot help."""
    if need > budget:
        raise ModelTooLarge(
            f"the model needs about {need / 1e9:.2f} GB (weights and KV cache) and the "
            f"memory budget is {budget / 1e9:.2f} GB; raise --memory-budget "
            "or lower --ctx-size / --max-num-seqs / --kv-type")
    models = list(models)
    idle = sorted((e for e in models if e.idle), key=lambda e: e.last_used)
    total = sum(e.bytes for e in models)
    slots, used, victims = len(models), total, []
    while slots >= models_max or used + need > budget:
        if not idle:
            return (f"every loaded model is busy ({total / 1e9:.2f} of {budget / 1e9:.2f} GB, "
                    f"{len(models)} of {models_max} models); {need / 1e9:.2f} GB more is "
                    "needed"), []
        victim = idle.pop(0)
        slots, used = slots - 1, used - victim.bytes
        victims.append(victim)
    return None, victims


class Waiters:
    """The wake callbacks of waiting requests, by model (None: a caller
    that did not say), in arrival order. Not locked itself: the pool calls
    it under its own lock."""

    def __init__(self, cap: int):
        self.cap = cap
        self._by_model: dict[str | None, dict[Callable[[], None], None]] = {}

    def add(self, wake: Callable[[], None], model: str | None) -> None:
        """Register `wake` as waiting for `model`. Raises ModelsBusy when
        `cap` requests already wait for it."""
        waiting = self._by_model.setdefault(model, {})
        if len(waiting) >= self.cap:
            if not waiting:
                del self._by_model[model]
            what = f"model {model!r}" if model else "a model"
            raise ModelsBusy(f"{len(waiting)} requests already wait for {what} to have room "
                             "(LLMCTL_MODEL_WAITERS_MAX); try again later")
        waiting[wake] = None

    def remove(self, wake: Callable[[], None]) -> bool:
        """Forget `wake`; False when it was not registered."""
        for model, waiting in self._by_model.items():
            if wake in waiting:
                del waiting[wake]
                if not waiting:
                    del self._by_model[model]
                return True
        return False

    def __len__(self) -> int:
        return sum(len(w) for w in self._by_model.values())

    def due(self, status: Callable[[str], str], need_of: Callable[[str], int | None],
            room: Room, failed: Iterable[str] = (), everyone: bool = False,
            handoff: bool = False) -> list[Callable[[], None]]:
        """The waiters whose try can now succeed, oldest model first: all
        of a loaded model's, all of a model whose load `failed` (they get
        its error), and for each absent model its oldest waiter while
        `room` holds it (the rest then wait for that one's load). Callers
        that named no model get every event; `everyone` wakes all (shutdown).
        `handoff` (a waiter left): only absent models' oldest, since the one
        that left may have been woken for room it did not take; the others
        were woken already, and waking them on every departure would cost
        the square of their number."""
        failed = set(failed)
        out: list[Callable[[], None]] = []
        for model, waiting in self._by_model.items():
            if everyone or (not handoff and (model is None or model in failed)):
                out.extend(waiting)
            elif model is None:
                continue
            elif (state := status(model)) == LOADED and not handoff:
                out.extend(waiting)
            elif state == ABSENT and room.take(need_of(model)):
                out.append(next(iter(waiting)))
        return out


def call_all(wakes: Iterable[Callable[[], None]]) -> None:
    """Call each wake; one that fails (its loop is gone) stops no other."""
    for wake in wakes:
        try:
            wake()
        except Exception:
            log.debug("a pool waiter failed", exc_info=True)


class NeedCache:
    """estimate_bytes once per file, outside the pool's lock: the first
    estimate of a file reads its GGUF header. Concurrent first asks for one
    file share one read."""

    def __init__(self, estimate: Callable, opts):
        self._estimate, self._opts = estimate, opts
        self._lock = threading.Lock()
        self._by_path: dict[str, int] = {}
        self._by_name: dict[str, int] = {}
        self._reading: dict[str, threading.Lock] = {}

    def known(self, resolved) -> int | None:
        """The estimate if one was made already; never reads."""
        return self._by_path.get(str(resolved.path))

    def of_name(self, name: str) -> int | None:
        """The last estimate made for the model `name`, if any."""
        return self._by_name.get(name)

    def get(self, resolved) -> int:
        """The estimate, reading the file the first time. Raises what the
        estimator raises (BadModelFile for a file that is not GGUF)."""
        key = str(resolved.path)
        with self._lock:
            reading = self._reading.setdefault(key, threading.Lock())
        with reading:
            if key not in self._by_path:
                self._by_path[key] = self._estimate(resolved, self._opts)
            self._by_name[resolved.name] = self._by_path[key]
            return self._by_path[key]
