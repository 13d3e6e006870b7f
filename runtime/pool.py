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
from dataclasses import dataclass, replace
from typing import Callable

from llmctl.errors import LlmctlError, ModelsBusy, ModelTooLarge
from llmctl.runtime.config import LoadOptions
from llmctl.runtime.keep_alive import FOREVER, MAX_KEEP_ALIVE_S, parse_keep_alive  # noqa: F401
from llmctl.runtime.stats import Stats, combine
from llmctl.store.registry import load_registry
from llmctl.store.resolve import ResolvedModel, resolve_name

log = logging.getLogger("llmctl.pool")

# llama.cpp's compute buffers and the engine's own arrays, beyond weights and KV.
OVERHEAD_BYTES = 64 << 20


def estimate_bytes(resolved: ResolvedModel, opts: LoadOptions) -> int:
    """Memory a model will hold once loaded: its weights, the KV cache of
    every slot at the context it will get, and a fixed overhead. Raises
    BadModelFile for a file that is not GGUF."""
    from llmctl.runtime import planner
    from llmctl.runtime.llm import DEFAULT_CTX
    from llmctl.store.gguf_info import read_gguf_info

    info = read_gguf_info(resolved.path)
    n_ctx = opts.ctx_size or min(resolved.context or DEFAULT_CTX,
                                 info.context_length or DEFAULT_CTX)
    shape = planner.ModelShape.from_info(info, opts.kv_type)
    return info.size + shape.kv_bytes(n_ctx * opts.max_num_seqs) + OVERHEAD_BYTES


@dataclass
class Loaded:
    """A model in the pool. `active`: requests using it now; it expires
    `keep_alive_s` after the last one ends (FOREVER: never)."""

    name: str
    resolved: ResolvedModel
    bytes: int
    keep_alive_s: float
    llm: object = None               # the LLM, once loaded
    error: BaseException | None = None
    active: int = 0
    last_used: float = 0.0
    loaded_at: float = 0.0

    @property
    def loading(self) -> bool:
        return self.llm is None and self.error is None

    @property
    def expires_at(self) -> float | None:
        """Wall-clock time it unloads if nothing uses it; None: never, or in use."""
        if self.active or self.keep_alive_s < 0:
            return None
        return self.last_used + self.keep_alive_s


class Lease:
    """One request's hold on a loaded model; `release()` (or leaving the
    `with`) lets the pool unload it again."""

    def __init__(self, pool: "ModelPool", entry: Loaded):
        self.pool, self.entry = pool, entry
        self.llm = entry.llm
        self.name = entry.name
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.pool._release(self.entry)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


@dataclass
class Reservation:
    """ModelPool.try_reserve's answer: `entry` with one use counted (to
    `fill` first when `fresh`), or None and `why` the caller must wait;
    `loading` is the entry being loaded by another request meanwhile."""

    entry: Loaded | None
    fresh: bool = False
    why: str = ""
    loading: Loaded | None = None

    def raise_failed(self) -> None:
        """After a wait: raise the error the load this waited for ended in."""
        if self.loading is not None and self.loading.error is not None:
            raise self.loading.error


class ModelPool:
    """The loaded models of one server. `resolve` maps a request's model
    name to a file (never a path from a request); `acquire` loads or reuses
    it. Raises, from acquire: ModelNotFound, ModelTooLarge (507) when the
    model alone exceeds the budget, ModelsBusy (503) when no idle model can
    make room in time, and whatever loading raises."""

    def __init__(self, opts: LoadOptions, *, models_max: int = 3, memory_budget: int,
                 keep_alive_s: float = 300.0, wait_s: float = 300.0,
                 loader: Callable[[ResolvedModel, LoadOptions], object] | None = None,
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
        self._waiters: set[Callable[[], None]] = set()
        self._needs: dict[tuple[str, str], int] = {}   # estimate_bytes, once per file
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

    def resolve(self, ref: str) -> ResolvedModel:
        """The model a request names: a command-line model (or an alias of
        one), or a name from the registry or the store. Raises ModelNotFound
        with one message (store.resolve.UNKNOWN_MODEL) for every other name,
        a file path included: a request body must never make the server open,
        or even look for, a file of its choosing."""
        ref = ref.removesuffix(":latest")       # Ollama clients add the default tag
        named = self._named.get(ref)
        if named is not None:
            return named
        # Clients also send a registry model's Hub spelling (repo, repo:quant).
        for spec in load_registry().models.values():
            if ref in (spec.repo, f"{spec.repo}:{spec.quant}"):
                ref = spec.name
        return resolve_name(ref)

    # ---- leases -------------------------------------------------------------------

    def acquire_loaded(self, ref: str, keep_alive_s: float | None = None) -> Lease | None:
        """A lease on `ref` if it is loaded under that name or a command-line
        alias, without touching the disk; None otherwise. Never blocks."""
        ref = ref.removesuffix(":latest")
        named = self._named.get(ref)
        with self._cv:
            entry = self._models.get(named.name if named else ref)
            if entry is None or entry.loading or self._closed:
                return None
            self._use(entry, keep_alive_s)
            return Lease(self, entry)

    def adopt(self, resolved: ResolvedModel, llm) -> None:
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
        with self._cv:
            while (got := self.try_reserve(resolved, keep_alive_s)).entry is None:
                self._wait(deadline, got.why)
                got.raise_failed()
        return self.fill(got.entry) if got.fresh else Lease(self, got.entry)

    def try_reserve(self, resolved: ResolvedModel, keep_alive_s: float | None) -> "Reservation":
        """Never waits: the loaded entry with this use counted, a new
        loading entry the caller must `fill` (or `abandon`), or nothing and
        why (wait for add_waiter's call, then try again). Unloading idle
        models to make room happens here. Raises ModelTooLarge and, once
        closed, LlmctlError."""
        with self._cv:
            self._check_open()
            entry = self._models.get(resolved.name)
            if entry is not None and entry.loading:
                return Reservation(None, why=f"model {resolved.name!r} is still loading",
                                   loading=entry)
            if entry is not None:
                self._use(entry, keep_alive_s)
                return Reservation(entry)
            need = self._need(resolved)
            why = self._make_room(need)
            if why is not None:
                return Reservation(None, why=why)
            entry = Loaded(resolved.name, resolved, need,
                           self.keep_alive_s if keep_alive_s is None else keep_alive_s,
                           active=1, last_used=time.time())
            self._models[entry.name] = entry
            return Reservation(entry, fresh=True)

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
                self._notify()
            raise
        with self._cv:
            entry.llm, entry.loaded_at = llm, time.time()
            self._notify()
            if self._closed:        # shut down while it loaded: nobody may use it
                self._unload(entry, "shutdown")
                raise LlmctlError("the server is shutting down")
        log.info("loaded %s (%.0f MB planned)", entry.name, entry.bytes / 1e6)
        return Lease(self, entry)

    def abandon(self, entry: Loaded) -> None:
        """Give back a fresh reservation that will not be filled (its
        request went away first); waiters for it try again."""
        with self._cv:
            if entry.loading and self._models.get(entry.name) is entry:
                del self._models[entry.name]
            self._notify()

    def add_waiter(self, wake: Callable[[], None]) -> None:
        """Call `wake()` (under the pool's lock: it must not block) whenever
        a reservation that had to wait may now succeed."""
        with self._cv:
            self._waiters.add(wake)

    def remove_waiter(self, wake: Callable[[], None]) -> None:
        with self._cv:
            self._waiters.discard(wake)

    def _notify(self) -> None:
        self._cv.notify_all()
        for wake in list(self._waiters):
            try:
                wake()
            except Exception:       # a waiter whose loop is gone
                log.debug("a pool waiter failed", exc_info=True)

    def _need(self, resolved: ResolvedModel) -> int:
        key = (resolved.name, str(resolved.path))
        if key not in self._needs:
            self._needs[key] = self._estimate(resolved, self.opts)
        return self._needs[key]

    @staticmethod
    def _use(entry: Loaded, keep_alive_s: float | None) -> None:
        entry.active += 1
        entry.last_used = time.time()
        if keep_alive_s is not None:
            entry.keep_alive_s = keep_alive_s

    def _make_room(self, need: int) -> str | None:
        """Unload idle models, least recently used first, until `need` bytes
        and a model slot are free: None once they are, else why the caller
        must wait for a request to end. Raises when waiting cannot help."""
        if need > self.memory_budget:
            raise ModelTooLarge(
                f"the model needs about {need / 1e9:.2f} GB (weights and KV cache) and the "
                f"memory budget is {self.memory_budget / 1e9:.2f} GB; raise --memory-budget "
                "or lower --ctx-size / --max-num-seqs / --kv-type")
        while len(self._models) >= self.models_max or self._used() + need > self.memory_budget:
            idle = [e for e in self._models.values() if not e.active and not e.loading]
            if not idle:
                return (f"every loaded model is busy ({self._used() / 1e9:.2f} of "
                        f"{self.memory_budget / 1e9:.2f} GB, {len(self._models)} of "
                        f"{self.models_max} models); {need / 1e9:.2f} GB more is needed")
            self._unload(min(idle, key=lambda e: e.last_used), "to make room")
        return None

    def _wait(self, deadline: float, why: str) -> None:
        left = deadline - time.monotonic()
        if left <= 0 or not self._cv.wait(timeout=left) and time.monotonic() >= deadline:
            raise ModelsBusy(why)

    def _release(self, entry: Loaded) -> None:
        with self._cv:
            entry.active -= 1
            entry.last_used = time.time()
            if not entry.active and entry.keep_alive_s == 0 and self._models.get(entry.name) is entry:
                self._unload(entry, "keep_alive 0")
            self._notify()

    # ---- unloading ----------------------------------------------------------------

    def unload(self, ref: str) -> bool:
        """Unload `ref` now if it is loaded and idle; with requests running,
        it unloads when the last ends. False when it is not loaded."""
        name = self.resolve(ref).name
        with self._cv:
            entry = self._models.get(name)
            if entry is None or entry.loading:
                return False
            if entry.active:
                entry.keep_alive_s = 0
            else:
                self._unload(entry, "stop")
            self._notify()
            return True

    def _unload(self, entry: Loaded, why: str) -> None:
        # Under the lock: closing joins the engine thread, which is quick when
        # idle, and no request can take the model halfway through.
        del self._models[entry.name]
        log.info("unloading %s (%s)", entry.name, why)
        try:
            # Its counters stay in the server's totals after it is gone.
            self.retired = combine([self.retired, entry.llm.stats().idle()])
            entry.llm.close()
        except Exception:
            log.exception("closing %s", entry.name)

    def _reap(self) -> None:
        """Unload models whose keep-alive ran out."""
        with self._cv:
            while not self._closed:
                now = time.time()
                due = [e for e in self._models.values()
                       if not e.loading and e.expires_at is not None and e.expires_at <= now]
                for entry in due:
                    self._unload(entry, "keep-alive expired")
                if due:
                    self._notify()
                nexts = [e.expires_at for e in self._models.values()
                         if not e.loading and e.expires_at is not None]
                self._cv.wait(timeout=min(max(min(nexts) - now, 0.05), 60) if nexts else 60)

    # ---- views --------------------------------------------------------------------

    def loaded(self) -> list[Loaded]:
        """The loaded (and loading) models, most recently used first."""
        with self._cv:
            return sorted(self._models.values(), key=lambda e: -e.last_used)

    def get(self, name: str) -> Loaded | None:
        with self._cv:
            return self._models.get(name)

    def stats(self) -> Stats:
        """Every model's counters, loaded or not, in one snapshot."""
        with self._cv:
            return combine([self.retired] + [e.llm.stats() for e in self._models.values()
                                             if e.llm is not None])

    def _used(self) -> int:
        return sum(e.bytes for e in self._models.values())

    def _check_open(self) -> None:
        if self._closed:
            raise LlmctlError("the server is shutting down")

    def close(self) -> None:
        """Unload everything; later acquires raise."""
        with self._cv:
            self._closed = True
            for entry in list(self._models.values()):
                if not entry.loading:
                    self._unload(entry, "shutdown")
            self._notify()
        self._reaper.join(timeout=5)


def _load_llm(resolved: ResolvedModel, opts: LoadOptions):
    from llmctl.runtime.llm import LLM

    return LLM(resolved, opts)
