"""What a GPU changes, checked without one: the set-up builds CUDA for the
GPU's own architecture only (a stand-in nvidia-smi answers as an H200
would), and the automatic load options settle for a model wholly on a GPU."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from llmctl.runtime.batching import CPU_STEP_TOKENS, GPU_STEP_TOKENS
from llmctl.runtime.load_options import LoadOptions

REPO = Path(__file__).resolve().parents[1]


def _cmake_args(tmp_path: Path, *, gpu: str | None, **env: str) -> str:
    """The CMAKE_ARGS scripts/_setup.sh would build with, with stand-ins for
    nvcc and (when `gpu` names a compute capability) nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "nvcc").write_text("#!/bin/sh\nexit 0\n")
    if gpu is not None:
        (bin_dir / "nvidia-smi").write_text(
            "#!/bin/sh\n[ \"$1\" = -L ] && { echo 'GPU 0: NVIDIA H200'; exit 0; }\n"
            f"echo {gpu}\n")
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    out = subprocess.run(["bash", "-c", f"source {REPO}/scripts/_setup.sh"], capture_output=True,
                         text=True, timeout=60,
                         env={**os.environ, "PATH": path, "LLMCTL_SETUP_PRINT_ARGS": "1", **env})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_cuda_is_built_for_this_gpus_architecture_only(tmp_path):
    args = _cmake_args(tmp_path, gpu="9.0")
    assert "-DGGML_CUDA=ON" in args and "-DCMAKE_CUDA_ARCHITECTURES=90" in args.split()


def test_an_architecture_list_can_be_named(tmp_path):
    args = _cmake_args(tmp_path, gpu="9.0", LLMCTL_CUDA_ARCH="86;90")
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;90" in args.split()


@pytest.mark.parametrize("gpu, force, cuda", [(None, "auto", False), ("9.0", "0", False),
                                              (None, "1", True)])
def test_cuda_only_with_a_gpu_unless_forced(tmp_path, gpu, force, cuda):
    args = _cmake_args(tmp_path, gpu=gpu, LLMCTL_CUDA=force)
    assert ("-DGGML_CUDA=ON" in args) is cuda


def test_a_model_wholly_on_a_gpu_gets_the_gpus_defaults():
    gpu = LoadOptions(max_num_seqs=64).on_device(True)
    assert (gpu.step_tokens, gpu.use_flash_attn, gpu.backend_sampling) == \
        (GPU_STEP_TOKENS, True, True)
    cpu = LoadOptions(max_num_seqs=16).on_device(False)
    assert (cpu.step_tokens, cpu.use_flash_attn, cpu.backend_sampling) == \
        (CPU_STEP_TOKENS, True, False)
    mine = LoadOptions(max_num_batched_tokens=300, flash_attn=False, backend_sampling=False)
    assert mine.on_device(True) == mine             # what was asked for stays
