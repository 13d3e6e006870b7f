"""`--n-gpu-layers auto`: how many layers fit in free VRAM, and how much KV
cache a context of each KV type needs.

Plain arithmetic over a model's size and shape, so it is unit-tested with
simulated GPUs. The estimate is deliberately conservative: an offload that
does not fit fails at load time, while one layer too few costs a little speed."""

from __future__ import annotations

from dataclasses import dataclass

from llmctl.store.gguf_info import GGUFInfo, kv_bytes_per_elem, kv_cache_bytes

MIB = 1 << 20
# CUDA context, cuBLAS workspace and llama.cpp's compute buffers: the
# largest models need the most (docs/measurements.md has the figures).
RESERVE_BYTES = 1024 * MIB
SAFETY = 0.92   # keep 8% of free memory for fragmentation and other processes


@dataclass(frozen=True)
class ModelShape:
    """A model's sizes as the planner needs them: weight bytes, layers, the
    attention shape and the KV cache's bytes per element."""

    weights_bytes: int      # file size is a close upper bound for GGUF weights
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    kv_bytes_per_elem: float = 2.0   # f16 KV cache
    head_dim: int = 0                # 0: n_embd / n_head

    @classmethod
    def from_info(cls, info: GGUFInfo, kv_type: str = "f16") -> "ModelShape":
        """The shape of a GGUF with a `kv_type` cache. Raises ValueError for
        an unknown KV type."""
        return cls(info.size, info.n_layers, info.n_embd, info.n_head, info.n_head_kv or info.n_head,
                   kv_bytes_per_elem=kv_bytes_per_elem(kv_type), head_dim=info.head_dim)

    def kv_bytes_per_layer(self, n_ctx: int) -> int:
        head_dim = self.head_dim or self.n_embd // max(self.n_head, 1)
        return kv_cache_bytes(n_ctx, self.n_head_kv, head_dim,
                              bytes_per_elem=self.kv_bytes_per_elem)

    def kv_bytes(self, n_ctx: int) -> int:
        """The whole model's KV cache for `n_ctx` tokens (all sequences)."""
        return self.kv_bytes_per_layer(n_ctx) * self.n_layers

    def layer_bytes(self) -> int:
        # Embeddings and output head live outside the repeating layers; they
        # are about 1/(n_layers+2) of the file for typical models.
        return self.weights_bytes // (self.n_layers + 2)


def plan_gpu_layers(shape: ModelShape, free_vram_bytes: list[int], n_ctx: int,
                    gpu_capable: bool) -> int:
    """Layers to offload (n_layers + 1 means everything, output head too)."""
    if not gpu_capable or not free_vram_bytes or shape.n_layers <= 0:
        return 0
    budget = sum(int(f * SAFETY) for f in free_vram_bytes) - RESERVE_BYTES * len(free_vram_bytes)
    per_layer = shape.layer_bytes() + shape.kv_bytes_per_layer(n_ctx)
    head = shape.weights_bytes - shape.layer_bytes() * shape.n_layers
    if budget <= 0 or per_layer <= 0:
        return 0
    if per_layer * shape.n_layers + head <= budget:
        return shape.n_layers + 1
    return max(0, min(shape.n_layers, budget // per_layer))


def kv_slots(shape: ModelShape, n_ctx_seq: int, budget_bytes: int) -> int:
    """How many sequences of `n_ctx_seq` tokens fit their KV cache in
    `budget_bytes`: the figure a smaller KV type raises."""
    per_slot = shape.kv_bytes(n_ctx_seq)
    return budget_bytes // per_slot if per_slot > 0 else 0


def parse_gpu_layers(value: str | int) -> int | None:
    """'auto' -> None (plan it); an integer -> that many; else ValueError."""
    if isinstance(value, int):
        n = value
    elif str(value).strip().lower() == "auto":
        return None
    else:
        n = int(str(value).strip())
    if n < -1:
        raise ValueError("n_gpu_layers must be 'auto', -1 (all) or >= 0")
    return n
