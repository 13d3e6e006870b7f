"""llama.cpp's library is mapped before numpy's in every llmctl process
(llmctl/native.py): a CUDA build crashed at the first model load when
numpy's OpenBLAS came first. The order is read from the dynamic linker's
own list (dl_iterate_phdr walks it in load order), in a fresh interpreter,
on this CPU build."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

from llmctl.native import library_path

ORDER = textwrap.dedent('''
    import ctypes
    import llmctl.runtime.llm       # gguf imports numpy before the engine imports llama_cpp
    import numpy

    class Info(ctypes.Structure):
        _fields_ = [("addr", ctypes.c_uint64), ("name", ctypes.c_char_p),
                    ("phdr", ctypes.c_void_p), ("phnum", ctypes.c_uint16)]

    names = []
    walk = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t,
                            ctypes.c_void_p)(
        lambda info, size, data: names.append((info.contents.name or b"").decode()) or 0)
    ctypes.CDLL(None).dl_iterate_phdr(walk, None)
    at = lambda key: next(i for i, n in enumerate(names) if key in n.rsplit("/", 1)[-1])
    print("llama-first" if at("libllama.so") < at("_multiarray_umath") else "numpy-first")
''')


def _order(**env: str) -> str:
    out = subprocess.run([sys.executable, "-c", ORDER], capture_output=True, text=True,
                         timeout=120, env={**os.environ, **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_libllama_is_mapped_before_numpy():
    assert _order() == "llama-first"


def test_without_the_hook_numpy_comes_first_as_it_did():
    # The check above can fail: this is the order that crashed.
    assert _order(LLMCTL_NO_PRELOAD="1") == "numpy-first"


def test_the_help_loads_neither():
    code = ("import sys; from llmctl.cli.app import main; sys.argv = ['llmctl', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('numpy' in sys.modules, 'llama_cpp' in sys.modules, file=sys.stderr)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.stderr.strip().splitlines()[-1] == "False False", out.stderr


MAPPED = textwrap.dedent('''
    import llmctl, numpy, llama_cpp
    from llmctl import native
    llama_cpp.llama_backend_init()
    print("\\n".join(str(p.parent.name) for p in native.mapped_libraries()))
''')


def _build_copies(tmp_path):
    """Two copies of this build's libraries: "other", and "asked", whose
    libraries look for theirs in ./other, as a build folder copied aside
    looks in the folder it was built in (its RUNPATH)."""
    lib = library_path().parent
    other, asked = tmp_path / "other", tmp_path / "asked"
    shutil.copytree(lib, other)
    asked.mkdir()
    for f in lib.iterdir():
        data = f.read_bytes()
        assert data.count(b"$ORIGIN\0") <= 1, f.name
        (asked / f.name).write_bytes(data.replace(b"$ORIGIN\0", b"./other\0"))
    return asked


def _mapped(tmp_path, asked, **env: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", MAPPED], capture_output=True, text=True,
                         timeout=120, cwd=tmp_path,
                         env={**os.environ, "LLAMA_CPP_LIB_PATH": str(asked), **env})
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_a_build_folder_copied_aside_runs_its_own_ggml(tmp_path):
    asked = _build_copies(tmp_path)
    assert _mapped(tmp_path, asked) == {"asked"}
    # without the preload the copy's libllama ran the other folder's ggml
    assert "other" in _mapped(tmp_path, asked, LLMCTL_NO_PRELOAD="1")
