"""What the user typed: a models.toml name, or `org/repo[:TAG]`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from llmctl.errors import UsageError
from llmctl.store.registry import load_registry

# Hugging Face repo ids: `org/name`, letters, digits and `-_.`.
_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Reference:
    """A parsed pull reference: the name as typed, the Hub repo, and a quant
    tag or an exact file."""

    name: str                 # the reference as typed; the store name after the pull
    repo_id: str
    tag: str | None = None    # quant tag, matched against GGUF file names
    file: str | None = None   # an exact file (models.toml `file`)


def parse_reference(text: str) -> Reference:
    """`text` as a models.toml name or `[hf.co/]ORG/REPO[:QUANT]`. Raises
    UsageError for anything else or an empty tag, and what load_registry raises."""
    text = text.strip()
    spec = load_registry().get(text)
    if spec is not None:
        return Reference(name=text, repo_id=spec.repo, tag=spec.quant, file=spec.file)
    repo, _, tag = text.removeprefix("hf.co/").partition(":")
    if not _REPO_RE.match(repo) or ".." in repo:
        raise UsageError(f"not a models.toml name or a Hugging Face repo id: {text!r} "
                         "(expected NAME or ORG/REPO[:QUANT], e.g. "
                         "bartowski/Qwen2.5-0.5B-Instruct-GGUF:Q4_K_M)")
    if ":" in text and not tag:
        raise UsageError(f"empty quant tag in {text!r}")
    return Reference(name=text, repo_id=repo, tag=tag or None)
