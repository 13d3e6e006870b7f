"""Tokenizer → GGUF vocabulary: byte-level BPE from tokenizer.json, or
SentencePiece from tokenizer.model. Special token ids, add-BOS flags, merges
and the chat template are left to gguf's SpecialVocab, which reads
tokenizer.json/tokenizer_config.json exactly as llama.cpp's converter does."""

from __future__ import annotations

import json
import struct
from pathlib import Path

from llmctl.errors import BadModelFile, UsageError

# llama.cpp picks its pre-tokenizer regexes by name; the name is identified
# here by the tokenizer.json pre_tokenizer that produces the same splits.
_LLAMA3_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?"
              "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
_QWEN2_RE = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?"
             "[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
PRE_TOKENIZERS = {
    (("bytelevel", True),): "gpt-2",
    (("digits", True), ("bytelevel", True)): "smollm",
    (("split", _LLAMA3_RE), ("bytelevel", False)): "llama-bpe",
    (("split", _QWEN2_RE), ("bytelevel", False)): "qwen2",
}


def _signature(pre: dict | None) -> tuple:
    if not pre:
        return ()
    if pre.get("type") == "Sequence":
        return tuple(s for p in pre.get("pretokenizers", []) for s in _signature(p))
    kind = pre.get("type")
    if kind == "ByteLevel":
        return (("bytelevel", bool(pre.get("use_regex", True))),)
    if kind == "Digits":
        return (("digits", bool(pre.get("individual_digits", False))),)
    if kind == "Split":
        pattern = pre.get("pattern", {})
        return (("split", pattern.get("Regex", pattern.get("String"))),)
    return ((kind or "unknown", None),)


def pre_tokenizer_name(tokenizer: dict) -> str:
    name = PRE_TOKENIZERS.get(_signature(tokenizer.get("pre_tokenizer")))
    if name is None:
        raise UsageError("tokenizer.json uses a pre-tokenizer llmctl does not know; "
                         "supported: GPT-2, SmolLM/StarCoder, Llama 3, Qwen2 styles")
    return name


def _padded(n: int) -> tuple[list[str], list[int]]:
    import gguf

    return [f"[PAD{i}]" for i in range(n)], [gguf.TokenType.UNUSED] * n


def _add_added_tokens(tokens: list, types: list, added: list[dict]) -> None:
    import gguf

    for tok in added:
        i = int(tok["id"])
        if i >= len(tokens):
            tokens.extend(f"[PAD{j}]" for j in range(len(tokens), i + 1))
            types.extend([gguf.TokenType.UNUSED] * (i + 1 - len(types)))
        tokens[i] = tok["content"]
        types[i] = gguf.TokenType.CONTROL if tok.get("special") else gguf.TokenType.USER_DEFINED


def write_bpe_vocab(writer, model_dir: Path, n_vocab: int) -> None:
    import gguf

    path = model_dir / "tokenizer.json"
    try:
        tokenizer = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BadModelFile(f"{path}: unreadable ({e})") from e
    model = tokenizer.get("model", {})
    if model.get("type") != "BPE" or not isinstance(model.get("vocab"), dict):
        raise UsageError(f"{path}: only byte-level BPE tokenizers are supported "
                         f"(found {model.get('type')!r})")
    pre = pre_tokenizer_name(tokenizer)
    vocab = model["vocab"]
    tokens, types = _padded(max(n_vocab, max(vocab.values()) + 1))
    for text, i in vocab.items():
        tokens[i], types[i] = text, gguf.TokenType.NORMAL
    _add_added_tokens(tokens, types, tokenizer.get("added_tokens", []))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    _special_vocab(model_dir, len(tokens), merges=True).add_to_gguf(writer, quiet=True)


# --- SentencePiece: a tokenizer.model is a protobuf ModelProto; we read the
# three fields we need instead of depending on the sentencepiece package.

def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes):
    """(field number, wire type, value) for each field of a message."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif wire == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
        yield num, wire, value


def read_sentencepiece(path: Path) -> tuple[list[str], list[float], list[int], bool]:
    """Pieces, scores, token types (SentencePiece's type numbers equal gguf's
    TokenType), and whether a space is prefixed to the input."""
    try:
        data = path.read_bytes()
        pieces, scores, types, add_prefix = [], [], [], True
        for num, _, value in _fields(data):
            if num == 1:                        # repeated SentencePiece
                piece, score, kind = "", 0.0, 1
                for n, _, v in _fields(value):
                    if n == 1:
                        piece = v.decode("utf-8")
                    elif n == 2:
                        score = struct.unpack("<f", v)[0]
                    elif n == 3:
                        kind = v
                pieces.append(piece)
                scores.append(score)
                types.append(kind)
            elif num == 3:                      # NormalizerSpec
                for n, _, v in _fields(value):
                    if n == 3:
                        add_prefix = bool(v)
    except (OSError, ValueError, IndexError, UnicodeDecodeError, struct.error) as e:
        raise BadModelFile(f"{path}: not a readable SentencePiece model") from e
    if not pieces:
        raise BadModelFile(f"{path}: SentencePiece model has no pieces")
    return pieces, scores, types, add_prefix


def write_spm_vocab(writer, model_dir: Path, n_vocab: int) -> None:
    pieces, scores, types, add_prefix = read_sentencepiece(model_dir / "tokenizer.model")
    tokens, ttypes = _padded(max(n_vocab, len(pieces)))
    tokens[:len(pieces)] = pieces
    ttypes[:len(pieces)] = types
    all_scores = scores + [-1000.0] * (len(tokens) - len(scores))
    tj = model_dir / "tokenizer.json"
    if tj.is_file():
        try:
            added = json.loads(tj.read_text(encoding="utf-8")).get("added_tokens", [])
        except (OSError, ValueError):
            added = []
        # Only tokens beyond the SentencePiece vocabulary are new; the rest
        # (<s>, </s>, <unk>) already carry their SentencePiece types.
        _add_added_tokens(tokens, ttypes, [t for t in added if int(t["id"]) >= len(pieces)])
        all_scores += [-1000.0] * (len(tokens) - len(all_scores))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(all_scores)
    writer.add_token_types(ttypes)
    writer.add_add_space_prefix(add_prefix)
    _special_vocab(model_dir, len(tokens), merges=False).add_to_gguf(writer, quiet=True)


def _special_vocab(model_dir: Path, n_vocab: int, *, merges: bool):
    import gguf

    try:
        return gguf.SpecialVocab(model_dir, load_merges=merges, n_vocab=n_vocab)
    except (ValueError, OSError) as e:
        raise BadModelFile(f"{model_dir}: unreadable tokenizer files ({e})") from e


def write_vocab(writer, model_dir: Path, n_vocab: int) -> None:
    # SentencePiece first: Llama 2/TinyLlama/Mistral also ship a tokenizer.json
    # converted from it, but the .model is the original.
    if (model_dir / "tokenizer.model").is_file():
        write_spm_vocab(writer, model_dir, n_vocab)
    elif (model_dir / "tokenizer.json").is_file():
        write_bpe_vocab(writer, model_dir, n_vocab)
    else:
        raise BadModelFile(f"{model_dir}: no tokenizer.json or tokenizer.model")
