"""The names clients put in a request's `model` beyond llmctl's own, for
every protocol: Ollama's clients add the default tag (`smollm2:latest`),
and Ollama and LM Studio clients send a registry model's Hub spelling
(`repo`, `repo:quant`). The pool knows only llmctl's names and the
command line's aliases; these rules translate before it is asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmctl.store.registry import load_registry
from llmctl.store.resolve import resolve_name

if TYPE_CHECKING:
    from llmctl.runtime.pool.model_pool import ModelPool
    from llmctl.store.resolve import ResolvedModel

DEFAULT_TAG = ":latest"


def untagged(ref: str) -> str:
    """`ref` without Ollama's default tag; never reads a file."""
    return ref.removesuffix(DEFAULT_TAG)


def registry_name(ref: str) -> str:
    """The registry name of a model `ref` spells as on the Hub (its repo,
    or repo:quant); `ref` itself otherwise. Reads the registry file: call
    it off the event loop. Raises UsageError without a registry."""
    for spec in load_registry().models.values():
        if ref in (spec.repo, f"{spec.repo}:{spec.quant}"):
            ref = spec.name
    return ref


def resolve_request(pool: ModelPool, ref: str) -> ResolvedModel:
    """The model a request's `ref` names (blocking: off the event loop): a
    command-line model or alias, with the tag dropped; else the model of
    that name, or of that Hub spelling, in the registry or the store.
    Raises ModelNotFound (store.resolve.UNKNOWN_MODEL for any other name),
    and what registry_name raises."""
    ref = untagged(ref)
    return pool.named_model(ref) or resolve_name(registry_name(ref))


def unload_request(pool: ModelPool, ref: str) -> bool:
    """pool.unload for the model a request's `ref` names (blocking: off the
    event loop). Raises what resolve_request raises."""
    return pool.unload(resolve_request(pool, ref).name)
