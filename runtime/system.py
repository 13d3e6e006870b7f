"""What this machine and this build can do: CPU features, threads, RAM, GPUs."""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

import psutil


@dataclass
class GPU:
    """One GPU: its index, name, and total and free memory in MiB."""

    index: int
    name: str
    total_mib: int
    free_mib: int


@dataclass
class SystemInfo:
    """What `llmctl info` reports: CPU features and counts, RAM in GiB, GPU
    offload support, the GPUs and the build's CMAKE_ARGS."""

    cpu_features: list[str]
    physical_cores: int
    logical_cpus: int
    default_threads: int
    ram_total_gib: float
    ram_available_gib: float
    gpu_offload: bool
    gpus: list[GPU] = field(default_factory=list)
    build_flags: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


def physical_cores() -> int:
    """Physical CPU cores; logical CPUs when psutil cannot tell, and at least 1."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def default_threads() -> int:
    """Physical cores: llama.cpp's matmuls saturate a core's vector units, so
    hyper-threads add contention, but halving (a common default) leaves
    whole cores idle."""
    return physical_cores()


def list_gpus() -> list[GPU]:
    """GPUs with free memory, from NVML if importable, else nvidia-smi."""
    gpus = _nvml_gpus()
    return gpus if gpus is not None else _smi_gpus()


def _nvml_gpus() -> list[GPU] | None:
    try:
        import pynvml  # optional: nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        name = pynvml.nvmlDeviceGetName(h)
        gpus.append(GPU(i, name.decode() if isinstance(name, bytes) else name,
                        mem.total >> 20, mem.free >> 20))
    return gpus


def _smi_gpus() -> list[GPU]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.free",
             "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return parse_smi(out)


def parse_smi(text: str) -> list[GPU]:
    """GPUs from nvidia-smi's CSV (index, name, total and free MiB); other lines
    are skipped. Raises ValueError for a memory figure that is not a number."""
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4 and parts[0].isdigit():
            gpus.append(GPU(int(parts[0]), parts[1], int(float(parts[2])), int(float(parts[3]))))
    return gpus


def _build_flags() -> str:
    """The CMAKE_ARGS the set-up recorded beside the cached wheel, if any."""
    import json
    from importlib.metadata import PackageNotFoundError, distribution
    from pathlib import Path
    from urllib.parse import urlparse

    try:
        direct = distribution("llama_cpp_python").read_text("direct_url.json") or ""
    except PackageNotFoundError:
        return ""
    try:
        wheel = Path(urlparse(json.loads(direct)["url"]).path)
        return (wheel.parent / "CMAKE_ARGS").read_text().strip()
    except (KeyError, ValueError, OSError):
        return ""


def system_info() -> SystemInfo:
    """This machine and build: llama.cpp's CPU features, cores and threads,
    RAM, GPU offload, the GPUs and the build flags."""
    from llmctl.runtime import llama

    text = llama.system_info()
    features = sorted({part.split("=")[0].split(":")[-1].strip()
                       for part in text.split("|") if part.strip().endswith("= 1")})
    vm = psutil.virtual_memory()
    return SystemInfo(
        cpu_features=features,
        physical_cores=physical_cores(),
        logical_cpus=os.cpu_count() or 1,
        default_threads=default_threads(),
        ram_total_gib=round(vm.total / 2**30, 1),
        ram_available_gib=round(vm.available / 2**30, 1),
        gpu_offload=llama.supports_gpu_offload(),
        gpus=list_gpus(),
        build_flags=_build_flags(),
    )
