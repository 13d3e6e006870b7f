"""Tokenizers for building prompts to exact token counts: the GGUF's own
(through llmctl's llama.cpp runtime), the server's /tokenize, or a documented
approximation for servers that expose neither.

Each one encodes text the way the server will, special tokens included
(`encode` counts a BOS when the model adds one), and decodes tokens that
follow the `bos` leading specials back to text."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Protocol

import httpx


class Tokenizer(Protocol):
    kind: str   # "gguf", "server" or "approx"; recorded in the JSON
    bos: int    # how many special tokens `encode` puts in front

    def encode(self, text: str) -> list: ...

    def decode(self, tokens: list) -> str: ...


class GgufTokenizer:
    """The model's own vocabulary, loaded without weights, through the same
    runtime layer `llmctl serve` tokenizes with, so counts agree exactly."""

    kind = "gguf"

    def __init__(self, path: Path):
        from llmctl.runtime.llama import LlamaModel

        self._model = LlamaModel(path, vocab_only=True)
        self.bos = len(self.encode(""))

    def encode(self, text: str) -> list:
        return self._model.tokenize(text)

    def decode(self, tokens: list) -> str:
        return self._model.detokenize(tokens)


class ServerTokenizer:
    """POST /tokenize and /detokenize, as llama-server and vLLM offer them."""

    kind = "server"

    def __init__(self, client: httpx.Client, root: str, model: str, style: str):
        self._client, self._root, self._model, self._style = client, root, model, style
        self.bos = len(self.encode(""))

    @classmethod
    def probe(cls, root: str, model: str, headers: dict | None = None,
              timeout: float = 10.0) -> "ServerTokenizer | None":
        """The server's tokenizer if it has one that round-trips, else None."""
        client = httpx.Client(timeout=timeout, headers=headers)
        for style in ("llama", "vllm"):
            try:
                tok = cls(client, root, model, style)
                if tok.decode(tok.encode("hello world")[tok.bos:]).strip() == "hello world":
                    return tok
            except (httpx.HTTPError, KeyError, TypeError, ValueError):
                continue
        client.close()
        return None

    def encode(self, text: str) -> list:
        if self._style == "llama":
            body = {"content": text, "add_special": True}
        else:
            body = {"model": self._model, "prompt": text, "add_special_tokens": True}
        r = self._client.post(f"{self._root}/tokenize", json=body)
        r.raise_for_status()
        return [t if isinstance(t, int) else t["id"] for t in r.json()["tokens"]]

    def decode(self, tokens: list) -> str:
        body: dict[str, Any] = {"tokens": tokens}
        if self._style == "vllm":
            body["model"] = self._model
        r = self._client.post(f"{self._root}/detokenize", json=body)
        r.raise_for_status()
        data = r.json()
        return data["content"] if self._style == "llama" else data["prompt"]


class ApproxTokenizer:
    """One token per whitespace-led word, plus a BOS. Prompts are built only
    from short common English words, which are single tokens in the BPE and
    SentencePiece vocabularies of current models, so counts are usually
    within a few percent; the server's `usage` reports the true count."""

    kind = "approx"
    bos = 1
    _word = re.compile(r"\s*\S+")

    def encode(self, text: str) -> list:
        return ["<bos>", *self._word.findall(text)]

    def decode(self, tokens: list) -> str:
        return "".join(tokens)
