"""The evaluation text: the user's file, or the default text shipped in
quantize/data (written for this project)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from llmctl.errors import UsageError

DEFAULT_TEXT = "eval-text.txt"


def default_text_path() -> Path:
    return Path(str(resources.files("llmctl.quantize") / "data" / DEFAULT_TEXT))


def load_text(path: str | Path | None = None) -> str:
    target = Path(path).expanduser() if path else default_text_path()
    try:
        text = target.read_text(encoding="utf-8")
    except FileNotFoundError as e:
        raise UsageError(f"text file not found: {target}", param="file") from e
    except IsADirectoryError as e:
        raise UsageError(f"{target} is a directory, not a text file", param="file") from e
    except UnicodeDecodeError as e:
        raise UsageError(f"{target} is not UTF-8 text", param="file") from e
    except OSError as e:
        raise UsageError(f"cannot read {target}: {e.strerror}", param="file") from e
    if not text.strip():
        raise UsageError(f"{target} is empty", param="file")
    return text
