#!/usr/bin/env python3
"""Benchmark `llmctl quantize` against the bare llama.cpp quantizer, and the
safetensors → GGUF converter against the disk's own read speed.

    .venv/bin/python scripts/bench_quantize.py [--repeat 3] [--threads N]
        [--perplexity TEXT ...] [--json out.json]

Inputs are derived from the bundled SmolLM2 (F16 GGUF and a Hugging Face
export), as in tests/test_quantize.py. Both quantizer timings run in the same
process, interleaved, and the median of each is compared (target: ≤ 1.1×).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from quantize_helpers import export_hf_dir, make_f16_gguf  # noqa: E402


def evict(path: Path) -> None:
    """Drop a file's pages from the page cache so the next read hits the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_speed(path: Path) -> float:
    size = path.stat().st_size
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass
    return size / 1e6 / (time.perf_counter() - start)


def bench_quantize(f16: Path, work: Path, repeat: int, threads: int | None) -> dict:
    from llmctl.quantize import quantize_model
    from llmctl.runtime.llama import file_types, quantize_file

    q4_k_m = file_types()["Q4_K_M"]

    def bare(out: Path) -> None:
        # llama_model_quantize itself: no planning, no checks, no metadata.
        assert quantize_file(f16, out, q4_k_m, threads=threads or 0) == 0

    def ours(out: Path) -> None:
        quantize_model(str(f16), bits=4, output=out, threads=threads, force=True)

    bare(work / "warmup.gguf")            # first-call costs (page cache, imports)
    ours(work / "warmup.gguf")
    (work / "warmup.gguf").unlink()
    bare_t, ours_t = [], []
    for i in range(repeat):
        # Alternate the order so neither side always pays the other's writeback.
        pair = [(bare, bare_t), (ours, ours_t)]
        for fn, times in (pair if i % 2 == 0 else pair[::-1]):
            out = work / f"q-{i}.gguf"
            t = time.perf_counter()
            fn(out)
            times.append(time.perf_counter() - t)
            out.unlink()
    bare, ours = statistics.median(bare_t), statistics.median(ours_t)
    return {"bare_s": bare_t, "llmctl_s": ours_t, "bare_median_s": bare,
            "llmctl_median_s": ours, "ratio": ours / bare}


def bench_convert(hf: Path, work: Path, repeat: int) -> dict:
    from llmctl.quantize import convert_hf

    weights = hf / "model.safetensors"
    evict(weights)
    disk_cold = read_speed(weights)
    cached = read_speed(weights)
    cold, warm = [], []
    for i in range(repeat):
        evict(weights)
        out = work / f"conv-{i}.gguf"
        cold.append(convert_hf(hf, out).mb_per_s)
        out.unlink()
        warm.append(convert_hf(hf, out).mb_per_s)
        out.unlink()
    return {"size_mb": weights.stat().st_size / 1e6, "disk_read_mb_s": disk_cold,
            "page_cache_read_mb_s": cached, "convert_cold_mb_s": statistics.median(cold),
            "convert_warm_mb_s": statistics.median(warm)}


def bench_perplexity(f16: Path, work: Path, texts: list[str], threads: int | None) -> list:
    from llmctl.quantize import perplexity, quantize_model
    from llmctl.quantize.evaltext import load_text

    models = {"F16": f16}
    for qtype in ("Q8_0", "Q4_K_M"):
        models[qtype] = work / f"ppl-{qtype}.gguf"
        quantize_model(str(f16), type=qtype, output=models[qtype], threads=threads, force=True)
    rows = []
    for text_path in texts:
        text = load_text(None if text_path == "default" else text_path)
        base = None
        for label, path in models.items():
            r = perplexity(path, text, threads=threads)
            base = base or r.perplexity
            rows.append({"text": text_path, "model": label, "perplexity": r.perplexity,
                         "stderr": r.stderr, "chunks": r.chunks,
                         "vs_f16_pct": 100 * (r.perplexity / base - 1), "seconds": r.seconds})
            print(f"  {text_path}: {label:7} ppl {r.perplexity:8.3f} ± {r.stderr:.3f} "
                  f"({rows[-1]['vs_f16_pct']:+.2f}%, {r.chunks} chunks)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--perplexity", nargs="*", default=[],
                    help="texts for a perplexity table ('default' = the bundled text)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmctl-bench-") as tmp:
        work = Path(tmp)
        os.environ["LLMCTL_HOME"] = str(work / "home")   # never touch the user's store
        f16 = make_f16_gguf(work / "smollm2-f16.gguf")
        hf = export_hf_dir(f16, work / "hf")
        report = {"threads": args.threads or os.cpu_count()}
        print(f"quantize F16 → Q4_K_M ({args.repeat} runs each, interleaved)", flush=True)
        report["quantize"] = q = bench_quantize(f16, work, args.repeat, args.threads)
        print(f"  bare llama_model_quantize {q['bare_median_s']:.2f}s, llmctl "
              f"{q['llmctl_median_s']:.2f}s, ratio {q['ratio']:.3f} "
              f"({'OK' if q['ratio'] <= 1.1 else 'OVER'} ≤ 1.1)", flush=True)
        print("safetensors → GGUF F16", flush=True)
        report["convert"] = c = bench_convert(hf, work, args.repeat)
        print(f"  {c['size_mb']:.0f} MB; disk read {c['disk_read_mb_s']:.0f} MB/s (page cache "
              f"{c['page_cache_read_mb_s']:.0f}); convert cold {c['convert_cold_mb_s']:.0f} MB/s, "
              f"warm {c['convert_warm_mb_s']:.0f} MB/s", flush=True)
        if args.perplexity:
            print("perplexity (512-token windows, second half scored)", flush=True)
            report["perplexity"] = bench_perplexity(f16, work, args.perplexity, args.threads)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
