"""The rule that keeps prefix hits exact, written once: how much of a
computed prefix a prompt may reuse and still get the KV and logits it
would compute itself. The slot table, the prefix cache, the disk store and
the draft model all match prefixes with it.

ggml's CPU flash attention computes a chunk of at least `TILE` (64) query
rows with its tiled kernel and a shorter one row by row, and the two round
differently (a 63-row chunk changes the logits, 64 or more in any split do
not). llmctl's build computes every chunk with its own kernel
(scripts/llama_cpp_fa_rows.h), so there any cut is exact and the tile is
1; so it is with a quantized KV, which ggml's own per-row kernel takes at
every size. Elsewhere (a CPU without AVX2) the tile holds prompts apart
where exactness is asked for: a prompt of at least a tile's tokens is only
ever computed in chunks of at least a tile's rows: a reused prefix leaves a
tile to compute, a chunk cut for the budget leaves a tile for later, and
only prompt tokens are reused (a generated token was computed in a one-row
chunk). A shorter prompt goes row by row however it is cut, so it is cut
freely but reuses nothing. With a tile of 1 any cut is taken: exact with
llmctl's kernel, and the fast choice where the setting is not held to
exactness (flash attention off, or repacked weights, whose kernels are
inexact anyway: docs/exactness.md)."""

from __future__ import annotations

# Rows of ggml's flash-attention tile (GGML_FA_TILE_Q).
TILE = 64


def tile_for(flash_attn: bool, exact: bool, per_row: bool) -> int:
    """The tile the engine cuts prompts by: `TILE` where flash attention is
    held to exactness (`exact`) where a chunk of 64+ rows takes the tiled
    kernel (not `per_row`: llmctl's kernel, or ggml's for a quantized KV),
    else 1 (any cut). A hit's recomputed tile cost an agent's repeated turn
    about 0.9 s on a 9.5k-token prompt (docs/measurements.md, "Batch
    invariance"), which a setting that is inexact elsewhere would pay for
    nothing."""
    return TILE if flash_attn and exact and not per_row else 1


def exact_reuse(n: int, n_prompt: int, tile: int) -> int:
    """How much of an `n`-token computed prefix a prompt of `n_prompt`
    tokens may reuse and still get the KV it would compute itself (see the
    module docstring): all of it with `tile` 1; else none for a prompt
    shorter than a tile, and never the last tile's worth."""
    if tile <= 1:
        return n
    return 0 if n_prompt < tile else min(n, n_prompt - tile)


def usable_prefix(have: list[int], prompt: list[int]) -> int:
    """Tokens of `prompt` that `have` starts with, leaving the last prompt
    token to compute: its logits are what the first sample needs."""
    limit = min(len(have), len(prompt) - 1)
    if limit <= 0:
        return 0
    if have[:limit] == prompt[:limit]:
        return limit
    lo, hi = 0, limit          # have[:lo] matches, have[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if have[lo:mid] == prompt[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def reusable(have: list[int], prompt: list[int], tile: int) -> int:
    """Tokens of `prompt` whose KV may come from a slot holding `have`."""
    return exact_reuse(usable_prefix(have, prompt), len(prompt), tile)


def parkable(tokens: list[int], n_prompt: int, tile: int) -> list[int]:
    """The part of a finished sequence's computed `tokens` a later prompt
    may reuse: all with `tile` 1; else its prompt's tokens only, and none
    of a prompt shorter than a tile."""
    if tile <= 1:
        return tokens
    return tokens[:n_prompt] if n_prompt >= tile else []
