"""Which files of a repo a pull brings: one GGUF (all shards of a split
one), or a safetensors model's weights, config and tokenizer."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from llmctl.errors import UsageError
from llmctl.store.gguf_info import split_stem

# Ollama's `hf.co/...` and llama.cpp's `-hf` pick these when no tag is given.
DEFAULT_QUANTS = ("Q4_K_M", "Q8_0")
_QUANT_RE = re.compile(r"(?:^|[-._])((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32)(?=$|[-._])", re.I)
SAFETENSORS_SIDECARS = ("config.json", "generation_config.json", "tokenizer.json",
                        "tokenizer_config.json", "tokenizer.model", "special_tokens_map.json",
                        "vocab.json", "vocab.txt", "merges.txt", "added_tokens.json",
                        "chat_template.jinja", "chat_template.json", "*.safetensors",
                        "*.safetensors.index.json")


@dataclass(frozen=True)
class RemoteFile:
    """One file of a Hub repo: path, size, LFS sha256 and git blob id."""

    path: str
    size: int
    sha256: str | None = None     # LFS oid; None for small git-stored files
    blob_id: str | None = None    # git blob sha1

    @property
    def etag(self) -> str:
        """The Hub's ETag, which names the blob in the HF cache."""
        return self.sha256 or self.blob_id or ""


@dataclass
class Selection:
    """What a pull brings: the files, the first file of each GGUF model among
    them, and the kind."""

    files: list[RemoteFile]
    ggufs: list[str]              # first file of each selected GGUF model
    kind: str                     # "gguf" or "safetensors" or "files"


def _unit_key(path: str) -> str:
    stem = split_stem(path)
    return path if stem is None else stem


def gguf_units(files: list[RemoteFile]) -> dict[str, list[RemoteFile]]:
    """Group GGUF files into models: a split GGUF's shards form one unit."""
    units: dict[str, list[RemoteFile]] = {}
    for f in files:
        if f.path.lower().endswith(".gguf"):
            units.setdefault(_unit_key(f.path), []).append(f)
    return {k: sorted(v, key=lambda f: f.path) for k, v in units.items()}


def quant_of(path: str) -> str | None:
    """The quant tag in a file's name (Q4_K_M, IQ3_XS, BF16, ...), upper-cased;
    None without one."""
    found = _QUANT_RE.findall(path.rsplit("/", 1)[-1])
    return found[-1].upper() if found else None


def _tag_matches(tag: str, path: str) -> bool:
    # Bounded first, so `Q4_K` does not pick `IQ4_K...` over a real `Q4_K` file.
    bounded = re.search(rf"(?:^|[^A-Za-z0-9]){re.escape(tag)}(?:$|[^A-Za-z0-9])", path, re.I)
    return bool(bounded)


def _pick(units: dict[str, list[RemoteFile]], tag: str) -> list[str]:
    hits = [k for k in units if _tag_matches(tag, k)]
    if not hits:
        hits = [k for k in units if tag.lower() in k.lower()]
    plain = [k for k in hits if "mmproj" not in k.lower()]
    return sorted(plain or hits, key=len)[:1]


def _choose_gguf(units: dict[str, list[RemoteFile]], repo_id: str, tag: str | None,
                 file: str | None) -> str:
    if file:
        key = _unit_key(file)
        if key not in units:
            raise UsageError(f"{repo_id} has no file {file!r}")
        return key
    models = {k: v for k, v in units.items() if "mmproj" not in k.lower()} or units
    for want in ([tag] if tag else DEFAULT_QUANTS):
        picked = _pick(models, want) or _pick(units, want)
        if picked:
            return picked[0]
    quants = sorted({q for k in units if (q := quant_of(k))})
    if tag or len(models) > 1:
        what = f"no GGUF file in {repo_id} matches {tag!r}" if tag else \
            f"{repo_id} has several GGUF files and none is Q4_K_M or Q8_0"
        return _raise_choices(what, repo_id, quants)
    return next(iter(models))


def _raise_choices(what: str, repo_id: str, quants: list[str]) -> str:
    have = ", ".join(quants) if quants else "none recognised"
    raise UsageError(f"{what}; available quants: {have} (pick one: {repo_id}:TAG)")


def _globbed(files: list[RemoteFile], patterns: list[str]) -> list[RemoteFile]:
    return [f for f in files if any(fnmatch.fnmatch(f.path, p) or
                                    fnmatch.fnmatch(f.path.rsplit("/", 1)[-1], p)
                                    for p in patterns)]


def select_files(files: list[RemoteFile], repo_id: str, *, tag: str | None = None,
                 file: str | None = None, include: list[str] | None = None,
                 exclude: list[str] | None = None) -> Selection:
    """--include replaces the automatic choice; --exclude trims either."""
    units = gguf_units(files)
    if include:
        chosen, kind = _globbed(files, include), "files"
    elif units:
        key = _choose_gguf(units, repo_id, tag, file)
        chosen, kind = units[key], "gguf"
    elif any(f.path.endswith(".safetensors") for f in files):
        if tag:
            raise UsageError(f"{repo_id} has no GGUF files (only safetensors), so the "
                             f"quant tag {tag!r} cannot match; pull {repo_id} and run "
                             "`llmctl quantize`")
        chosen, kind = _globbed(files, list(SAFETENSORS_SIDECARS)), "safetensors"
    else:
        raise UsageError(f"{repo_id} has neither GGUF nor safetensors files")
    if exclude:
        dropped = {f.path for f in _globbed(chosen, exclude)}
        chosen = [f for f in chosen if f.path not in dropped]
    if not chosen:
        raise UsageError(f"no files of {repo_id} match the --include/--exclude patterns")
    chosen_paths = {f.path for f in chosen}
    ggufs = [v[0].path for v in gguf_units(chosen).values() if v[0].path in chosen_paths]
    return Selection(files=sorted(chosen, key=lambda f: f.path), ggufs=sorted(ggufs), kind=kind)
