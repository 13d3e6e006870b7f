"""llama.cpp's shared library loads before numpy does, in every llmctl
process.

With a CUDA build of llama.cpp, a process that had imported numpy before
llama_cpp crashed (SIGSEGV) inside llama_model_load_from_file, the first
CUDA call of the process; the same load passed whenever libllama (and with
it ggml, the CUDA runtime and cuBLAS) was mapped first. numpy's OpenBLAS
starts its worker threads and sets up its thread-local storage when numpy
is imported; the CUDA libraries must be in place before that. (See
scripts/gpu_check.sh, which reproduces the crash on a GPU machine and runs
the variants that locate it.)

llmctl imports numpy early (gguf reads model headers with it), so this
module puts a hook on numpy's first import that loads libllama first: the
same file, with the same flags (RTLD_LOCAL), that llama_cpp opens itself,
so its own load later returns this same handle. Commands that never touch
numpy pay nothing. LLMCTL_NO_PRELOAD=1 turns it off (to reproduce the
crash). The only file outside runtime/llama/ that names the library; it
calls nothing in it."""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

from llmctl import settings


def library_path() -> Path | None:
    """The libllama that llama_cpp will open: LLAMA_CPP_LIB_PATH's, else the
    package's own lib/; None when neither has one. Imports nothing."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        base = Path(override)
    else:
        try:
            spec = importlib.util.find_spec("llama_cpp")
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        base = Path(os.path.abspath(next(iter(spec.submodule_search_locations)))) / "lib"
    lib = base / "libllama.so"
    return lib if lib.is_file() else None


def _ggml_beside(lib: Path) -> list[Path]:
    """ggml's libraries in libllama's folder, each after those it needs."""
    rest = sorted(p for p in lib.parent.glob("libggml-*.so") if p.name != "libggml-base.so")
    named = [lib.parent / "libggml-base.so", *rest, lib.parent / "libggml.so"]
    return [p for p in named if p.is_file()]


def load_library() -> bool:
    """Map libllama now. Returns whether it loaded; raises nothing
    (llama_cpp's own import reports a broken library properly).

    With LLAMA_CPP_LIB_PATH, ggml's libraries in that folder are mapped
    first: libllama finds its ggml by soname, and one already mapped wins.
    Without that, a copy of a build folder (a build kept aside to compare)
    ran the ggml its RUNPATH named, the build's own folder, which by then
    held another build."""
    lib = library_path()
    if lib is None:
        return False
    try:
        if os.environ.get("LLAMA_CPP_LIB_PATH"):
            for dep in _ggml_beside(lib):
                ctypes.CDLL(str(dep))
        ctypes.CDLL(str(lib))
    except OSError:
        return False
    return True


def mapped_libraries() -> list[Path]:
    """The files of llama.cpp's libraries mapped into this process."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(None, 5)[-1].strip() for line in maps if ".so" in line}
    except OSError:
        return []
    return sorted(Path(p) for p in paths
                  if Path(p).name.startswith(("libllama.so", "libggml")))


class _LlamaBeforeNumpy(importlib.abc.MetaPathFinder):
    """Loads libllama the moment numpy is first imported, then steps aside."""

    def find_spec(self, name, path=None, target=None):  # noqa: ANN001 (importlib's protocol)
        if name == "numpy":
            uninstall()
            load_library()
        return None             # the normal finders import numpy itself


_HOOK = _LlamaBeforeNumpy()


def install() -> None:
    """Put the hook in place, unless numpy is already imported (too late:
    the caller imported it before llmctl) or LLMCTL_NO_PRELOAD is set."""
    if "numpy" in sys.modules or settings.no_preload():
        return
    if _HOOK not in sys.meta_path:
        sys.meta_path.insert(0, _HOOK)


def uninstall() -> None:
    if _HOOK in sys.meta_path:
        sys.meta_path.remove(_HOOK)
