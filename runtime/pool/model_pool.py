"""Many models in one process: loaded on first use, kept while requests use
them and for a keep-alive after, and unloaded least recently used first
when a new one needs the room (`models_max`, `memory_budget`).

Each loaded model is a whole LLM: its own engine, scheduler and prefix
cache. An unloaded model's disk prefix cache stays on disk, so a reload
answers a repeated prefix from it. Loading runs outside the lock, once per
model however many requests ask for it at the same time."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Callable, Sequence

from llmctl.errors import LlmctlError, ModelsBusy
from llmctl.runtime.engine.stats import Stats, combine
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.pool.room import (
    FOREVER,
    WAITERS_MAX,
    Lease,
    Loaded,
    NeedCache,
    Reservation,
    Waiters,
    call_all,
    estimate_bytes,
    plan_room,
    room_now,
    status_of,
    waiters_max,
)
from llmctl.store.registry import load_registry
from llmctl.store.resolve import ResolvedModel, resolve_name

if TYPE_CHECKING:
    from llmctl.runtime.llm import LLM

log = logging.getLogger("llmctl.pool")

class ModelPool:
    """The loaded models of one server. `resolve` maps a request's model
    name to a file (never a path from a request); `acquire` loads or reuses
    it. Raises, from acquire: ModelNotFound, ModelTooLarge (507) when the
    model alone exceeds the budget, ModelsBusy (503) when no idle model can
    make room in time, and whatever loading raises; from __init__,
    UsageError for a bad LLMCTL_MODEL_WAITERS_MAX.

    The lock guards bookkeeping only: estimating a file and closing an
    engine run outside it, so /health, /api/ps and leases on a loaded model
    never wait for them."""

    def __init__(self, opts: LoadOptions, *, models_max: int = 3, memory_budget: int,
                 keep_alive_s: float = 300.0, wait_s: float = 300.0, max_waiters: int = WAITERS_MAX,
                 loader: Callable[[ResolvedModel, LoadOptions], LLM] | None = None,
                 estimator: Callable[[ResolvedModel, LoadOptions], int] = estimate_bytes):
        if models_max < 1:
            raise ValueError("models_max must be >= 1")
        self.opts = opts
        self.models_max = models_max
        self.memory_budget = memory_budget
        self.keep_alive_s = keep_alive_s
        self.wait_s = wait_s
        self._load = loader or _load_llm
        self._estimate = estimator
        self._cv = threading.Condition()
        self._models: dict[str, Loaded] = {}
        self._named: dict[str, ResolvedModel] = {}     # given on the command line
        self._waiters = Waiters(waiters_max(opts.settings.model_waiters_max, max_waiters))
        self._events = 0                               # room events so far, for acquire
        self._needs = NeedCache(estimator, opts)
        self._closed = False
        self.retired = combine([])
        self._reaper = threading.Thread(target=self._reap, name="llmctl-keepalive", daemon=True)
        self._reaper.start()

    # ---- names --------------------------------------------------------------------

    def add_named(self, resolved: ResolvedModel, *aliases: str) -> None:
        """Make a model given on the command line (a file path, say)
        loadable by its name and `aliases` from requests."""
        for name in (resolved.name, *aliases):
            self._named[name] = resolved

    def _opts_for(self, resolved: ResolvedModel) -> LoadOptions:
        """A server's --draft is the draft of the model named with it on the
        command line; under --spec draft every other model uses its registry
        draft, or decodes plainly when it has none."""
        opts = self.opts
        if opts.spec_config.mode != "draft" or resolved.name in self.named():
            return opts
        entry = load_registry().get(resolved.name)
        return replace(opts, draft=None, spec="draft" if entry and entry.draft else None)

    def named(self) -> list[str]:
        """The names of the models given on the command line."""
        return list(dict.fromkeys(r.name for r in self._named.values()))

    def named_model(self, ref: str) -> ResolvedModel | None:
        """The command-line model `ref` names (its name or an alias), if any."""
        return self._named.get(ref)

    def resolve(self, ref: str) -> ResolvedModel:
        """The model a request names: a command-line model (or an alias of
        one), or a name from the registry or the store. Raises ModelNotFound
        with one message (store.resolve.UNKNOWN_MODEL) for every other name,
        a file path included: a request body must never make the server open,
        or even look for, a file of its choosing. A protocol's own spellings
        (Ollama's tags, say) are the server's to translate first."""
        named = self._named.get(ref)
        if named is not None:
            return named
        return resolve_name(ref)

    # ---- leases -------------------------------------------------------------------

    def acquire_loaded(self, ref: str, keep_alive_s: float | None = None) -> Lease | None:
        """A lease on `ref` if it is loaded under that name or a command-line
        alias, without touching the disk; None otherwise. Never blocks."""
        named = self._named.get(ref)
        with self._cv:
            entry = self._models.get(named.name if named else ref)
            if entry is None or entry.loading or entry.unloading or self._closed:
                return None
            self._use(entry, keep_alive_s)
            return Lease(self, entry)

    def adopt(self, resolved: ResolvedModel, llm: LLM) -> None:
        """Hold an LLM loaded elsewhere, forever (tests, embedding)."""
        with self._cv:
            self._models[resolved.name] = Loaded(resolved.name, resolved, 0, FOREVER, llm,
                                                 last_used=time.time(), loaded_at=time.time())
        self.add_named(resolved)

    def acquire(self, ref: str, keep_alive_s: float | None = None) -> Lease:
        """A lease on the model `ref`, loading it if needed (blocking: call
        it off the event loop). `keep_alive_s` replaces the model's keep-alive
        from this request on (0: unload as soon as it is idle). The server
        waits without a thread instead: try_reserve, add_waiter, fill."""
        resolved = self.resolve(ref)
        deadline = time.monotonic() + self.wait_s
        while True:
            seen = self._events         # an event after this is not missed
            if (got := self.try_reserve(resolved, keep_alive_s)).entry is not None:
                break
            with self._cv:
                left = deadline - time.monotonic()
                if left <= 0 or not self._cv.wait_for(partial(self._changed_since, seen), left):
                    raise ModelsBusy(got.why)
            got.raise_failed()
        return self.fill(got.entry) if got.fresh else Lease(self, got.entry)

    def _changed_since(self, seen: int) -> bool:
        return self._events != seen

    def try_reserve(self, resolved: ResolvedModel, keep_alive_s: float | None) -> Reservation:
        """Never waits: the loaded entry with this use counted, a new
        loading entry the caller must `fill` (or `abandon`), or nothing and
        why (wait for add_waiter's call, then try again). Unloading idle
        models to make room happens here, before it returns. Raises
        ModelTooLarge, what estimating raises (BadModelFile) and, once
        closed, LlmctlError."""
        need = self._needs.known(resolved)
        victims: list[Loaded]
        while True:
            with self._cv:
                self._check_open()
                entry = self._models.get(resolved.name)
                if entry is not None:
                    got, victims = self._reserve_known(entry, keep_alive_s), []
                    break
                if need is not None:
                    got, victims = self._reserve_new(resolved, need, keep_alive_s)
                    break
            need = self._needs.get(resolved)    # outside the lock: it may read the file
        self._close(victims)        # before the caller loads: their memory is free first
        return got

    def _reserve_known(self, entry: Loaded, keep_alive_s: float | None) -> Reservation:
        """Under the lock: a use of a model the pool holds, if it may be used."""
        if entry.unloading:
            return Reservation(None, why=f"model {entry.name!r} is being unloaded")
        if entry.loading:
            return Reservation(None, why=f"model {entry.name!r} is still loading", loading=entry)
        self._use(entry, keep_alive_s)
        return Reservation(entry)

    def _reserve_new(self, resolved: ResolvedModel, need: int,
                     keep_alive_s: float | None) -> tuple[Reservation, list[Loaded]]:
        """Under the lock: a loading entry for a model the pool lacks, with the
        idle models to unload for its room, or why there is no room."""
        name = resolved.name
        why, victims = self._make_room(need)
        if why is not None:
            return Reservation(None, why=why), []
        entry = Loaded(name, resolved, need,
                       self.keep_alive_s if keep_alive_s is None else keep_alive_s,
                       active=1, last_used=time.time())
        self._models[name] = entry
        return Reservation(entry, fresh=True), victims

    def fill(self, entry: Loaded) -> Lease:
        """Load the model of a fresh reservation (blocking) and lease it.
        Raises what loading raises (every waiter for it then gets the same
        error), and LlmctlError when the pool closed meanwhile."""
        try:
            llm = self._load(entry.resolved, self._opts_for(entry.resolved))
        except BaseException as e:
            with self._cv:
                entry.error = e
                self._models.pop(entry.name, None)
                self._event(failed=[entry.name])
            raise
        with self._cv:
            entry.llm, entry.loaded_at = llm, time.time()
            closed = self._closed
            victims = [self._begin_unload(entry, "shutdown")] if closed else []
            self._event()
        if closed:                  # shut down while it loaded: nobody may use it
            self._close(victims)
            raise LlmctlError("the server is shutting down")
        log.info("loaded %s (%.0f MB planned)", entry.name, entry.bytes / 1e6)
        return Lease(self, entry)

    def abandon(self, entry: Loaded) -> None:
        """Give back a fresh reservation that will not be filled (its
        request went away first); waiters for it try again."""
        with self._cv:
            if entry.loading and self._models.get(entry.name) is entry:
                del self._models[entry.name]
            self._event()

    def add_waiter(self, wake: Callable[[], None], model: str | None = None) -> None:
        """Call `wake()` (under the pool's lock: it must not block) when a
        reservation for `model` that had to wait may now succeed. A caller
        that names no model is woken on every event that frees room or ends
        a load. Raises ModelsBusy when LLMCTL_MODEL_WAITERS_MAX requests
        already wait for that model (or, naming none, for any)."""
        with self._cv:
            self._waiters.add(wake, model)

    def remove_waiter(self, wake: Callable[[], None]) -> None:
        """Forget `wake`. Should it have been woken and leave without taking
        the room, the waiters after it get their turn."""
        with self._cv:
            if self._waiters.remove(wake):
                self._event(handoff=True)

    def _event(self, failed: Sequence[str] = (), everyone: bool = False,
               handoff: bool = False) -> None:
        """Under the lock: something happened that may let a wait end."""
        self._events += 1
        self._cv.notify_all()
        models = self._models
        room = room_now(models.values(), self.models_max, self.memory_budget)
        call_all(self._waiters.due(lambda name: status_of(models.get(name)),
                                   self._needs.of_name, room, failed, everyone, handoff))

    @staticmethod
    def _use(entry: Loaded, keep_alive_s: float | None) -> None:
        entry.active += 1
        entry.last_used = time.time()
        if keep_alive_s is not None:
            entry.keep_alive_s = keep_alive_s

    def _make_room(self, need: int) -> tuple[str | None, list[Loaded]]:
        """Mark the idle models `need` takes the room of (see plan_room)."""
        why, victims = plan_room(self._models.values(), need, self.models_max, self.memory_budget)
        return why, [self._begin_unload(v, "to make room") for v in victims]

    def _release(self, entry: Loaded) -> None:
        with self._cv:
            entry.active -= 1
            entry.last_used = time.time()
            if entry.active:
                return              # still in use: no room can have appeared
            victims = []
            if entry.keep_alive_s == 0 and self._models.get(entry.name) is entry:
                victims.append(self._begin_unload(entry, "keep_alive 0"))
            else:
                self._event()       # it is idle: an unload may take it
        self._close(victims)

    # ---- unloading ----------------------------------------------------------------

    def unload(self, ref: str) -> bool:
        """Unload `ref` now if it is loaded and idle (closing its engine on
        this thread); with requests running, it unloads when the last ends.
        False when it is not loaded."""
        name = self.resolve(ref).name
        with self._cv:
            entry = self._models.get(name)
            if entry is None or entry.loading or entry.unloading:
                return False
            if entry.active:
                entry.keep_alive_s = 0
                return True
            victims = [self._begin_unload(entry, "stop")]
        self._close(victims)
        return True

    def _begin_unload(self, entry: Loaded, why: str) -> Loaded:
        """Under the lock: nobody may take `entry` from now on. Its counters
        stay in the server's totals after it is gone."""
        entry.unloading = True
        log.info("unloading %s (%s)", entry.name, why)
        try:
            if entry.llm is not None:
                self.retired = combine([self.retired, entry.llm.stats().idle()])
        except Exception:
            log.exception("counting %s", entry.name)
        return entry

    def _close(self, entries: list[Loaded]) -> None:
        """Outside the lock: close engines marked by _begin_unload (joining
        each engine's thread), then free their room."""
        if not entries:
            return
        for entry in entries:
            try:
                if entry.llm is not None:
                    entry.llm.close()
            except Exception:
                log.exception("closing %s", entry.name)
        with self._cv:
            for entry in entries:
                if self._models.get(entry.name) is entry:
                    del self._models[entry.name]
            self._event()

    def _reap(self) -> None:
        """Unload models whose keep-alive ran out."""
        while True:
            with self._cv:
                if self._closed:
                    return
                now = time.time()
                due = [e for e in self._models.values()
                       if e.idle and e.expires_at is not None and e.expires_at <= now]
                victims = [self._begin_unload(e, "keep-alive expired") for e in due]
                if not victims:
                    nexts = [e.expires_at for e in self._models.values()
                             if e.idle and e.expires_at is not None]
                    self._cv.wait(timeout=min(max(min(nexts) - now, 0.05), 60) if nexts else 60)
            self._close(victims)

    # ---- views --------------------------------------------------------------------

    def loaded(self) -> list[Loaded]:
        """The loaded (and loading) models, most recently used first; not
        those being unloaded."""
        with self._cv:
            return sorted((e for e in self._models.values() if not e.unloading),
                          key=lambda e: -e.last_used)

    def get(self, name: str) -> Loaded | None:
        """The entry of the model `name`, unless it is absent or unloading."""
        with self._cv:
            entry = self._models.get(name)
            return None if entry is None or entry.unloading else entry

    def stats(self) -> Stats:
        """Every model's counters, loaded or not, in one snapshot."""
        with self._cv:
            return combine([self.retired] + [e.llm.stats() for e in self._models.values()
                                             if e.llm is not None and not e.unloading])

    def _used(self) -> int:
        return sum(e.bytes for e in self._models.values())

    def _check_open(self) -> None:
        if self._closed:
            raise LlmctlError("the server is shutting down")

    def close(self) -> None:
        """Unload everything; later acquires raise."""
        with self._cv:
            self._closed = True
            victims = [self._begin_unload(e, "shutdown") for e in list(self._models.values())
                       if not e.loading and not e.unloading]
            self._event(everyone=True)
        self._close(victims)
        self._reaper.join(timeout=5)


def _load_llm(resolved: ResolvedModel, opts: LoadOptions) -> LLM:
    from llmctl.runtime.llm import LLM

    return LLM(resolved, opts)
