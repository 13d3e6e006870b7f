#!/usr/bin/env python3
"""One model load in a fresh process, with numpy imported before or after
llama_cpp: scripts/gpu_check.sh runs it in several variants to locate the
crash a CUDA build had when numpy came first. Prints one `at:` line per
stage, flushed, so the last one says where a process died, then the
libraries it had mapped, in load order.

    python3 scripts/gpu_probe.py MODEL --first numpy|llama [--gpu-init-first] [--layers N]
"""

from __future__ import annotations

import argparse
import ctypes
import faulthandler
import sys
import time

MAPPED = ("llama", "ggml", "openblas", "gfortran", "multiarray", "cuda", "cublas", "gomp")


def at(what: str) -> None:
    print(f"at: {time.monotonic():.3f} {what}", flush=True)


def mapped() -> list[str]:
    """Shared objects in the order the dynamic linker loaded them."""
    class Info(ctypes.Structure):
        _fields_ = [("addr", ctypes.c_uint64), ("name", ctypes.c_char_p),
                    ("phdr", ctypes.c_void_p), ("phnum", ctypes.c_uint16)]

    names: list[str] = []
    visit = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Info), ctypes.c_size_t,
                             ctypes.c_void_p)(
        lambda info, size, data: names.append((info.contents.name or b"").decode()) or 0)
    ctypes.CDLL(None).dl_iterate_phdr(visit, None)
    return [n for n in names if any(k in n.rsplit("/", 1)[-1] for k in MAPPED)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--first", choices=("numpy", "llama"), required=True)
    ap.add_argument("--gpu-init-first", action="store_true",
                    help="ask for the GPU devices (CUDA's init) before the load")
    ap.add_argument("--layers", type=int, default=99)
    args = ap.parse_args()
    faulthandler.enable(all_threads=True)
    if args.first == "numpy":
        import numpy
        at(f"numpy {numpy.__version__}")
    import llama_cpp as lc
    at(f"llama_cpp {lc.__version__}")
    for i, name in enumerate(mapped()):
        print(f"mapped {i:2d} {name}", flush=True)
    lc.llama_backend_init()
    at("llama_backend_init")
    if args.gpu_init_first:
        at(f"gpu offload supported: {lc.llama_supports_gpu_offload()}")
    params = lc.llama_model_default_params()
    params.n_gpu_layers = args.layers
    at(f"loading with {args.layers} layers on the GPU")
    model = lc.llama_model_load_from_file(args.model.encode(), params)
    at(f"loaded: {bool(model)}")
    if model:
        lc.llama_model_free(model)
    sys.exit(0 if model else 1)


if __name__ == "__main__":
    main()
