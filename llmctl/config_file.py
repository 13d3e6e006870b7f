"""The config file, `~/.config/llmctl/config.toml` (`$XDG_CONFIG_HOME/llmctl`,
or the file `LLMCTL_CONFIG` names): defaults for any command's flags by their
long names, read with tomllib.

    kv-type = "q8_0"            # every command with --kv-type
    [serve]
    memory-budget = "6GB"       # `llmctl serve` only
    [cache.ls]
    json = true                 # a subcommand: its group's table, then its own

A flag wins over an `LLMCTL_*` variable, which wins over this file, which
wins over the built-in default (cli/config_cmd.py hands the file to click as
its default map, whose order that is). Every mistake is one line naming the
file, the line and the key."""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmctl import settings
from llmctl.errors import UsageError

Table = tuple[str, ...]         # () is the top level; ("cache", "ls") is [cache.ls]

_HEADER = re.compile(r"^\s*\[\s*([^\[\]]+?)\s*\]\s*(#.*)?$")
_KEY = re.compile(r"""^\s*(?:"([^"]+)"|'([^']+)'|([A-Za-z0-9_-]+))\s*=""")


class ConfigError(UsageError):
    """A config file that cannot be used: its message is one line naming the
    file, the line and the key."""


def config_path() -> Path:
    """`LLMCTL_CONFIG`, else `$XDG_CONFIG_HOME/llmctl/config.toml`, else
    `~/.config/llmctl/config.toml`."""
    override = settings.config_file_override()
    if override:
        return override
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(xdg) / "llmctl" / "config.toml"


@dataclass(frozen=True)
class Setting:
    """One key of the file: its value as TOML gave it, and where it is."""

    value: Any
    line: int

    def where(self, path: Path) -> str:
        return f"{path}:{self.line}"


@dataclass
class ConfigFile:
    """The file's settings by table, each key a flag's long name without
    its dashes (`kv-type`; `kv_type` is read as the same)."""

    path: Path
    tables: dict[Table, dict[str, Setting]] = field(default_factory=dict)
    headers: dict[Table, int] = field(default_factory=dict)    # each [table]'s line

    @property
    def exists(self) -> bool:
        return self.path.is_file()

    def error(self, table: Table, key: str, reason: str) -> ConfigError:
        """The one-line error for `key` of `table`."""
        setting = self.tables.get(table, {}).get(key)
        line = setting.line if setting else self.headers.get(table, 1)
        name = ".".join((*table, key))
        return ConfigError(f"{self.path}:{line}: {name}: {reason}")

    def for_command(self, path: Table) -> dict[str, Setting]:
        """The settings that apply to the command at `path` (("serve",),
        ("cache", "ls")): the top level's, then each enclosing table's."""
        merged = dict(self.tables.get((), {}))
        for depth in range(1, len(path) + 1):
            merged.update(self.tables.get(path[:depth], {}))
        return merged


def load_config(path: Path | None = None) -> ConfigFile:
    """The config file at `path` (default: config_path()); an empty one when
    it does not exist. Raises ConfigError for a file that cannot be read, is
    not TOML, or holds something other than tables of settings."""
    path = path or config_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return ConfigFile(path)
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read the config file: {e}") from e
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        line = re.search(r"line (\d+)", str(e))
        raise ConfigError(f"{path}:{line.group(1) if line else 1}: not valid TOML: "
                          f"{str(e).split(' (at ')[0]}") from e
    config = ConfigFile(path)
    lines = _key_lines(text, config.headers)
    _gather(config, data, (), lines)
    return config


def _gather(config: ConfigFile, data: dict, table: Table,
            lines: dict[tuple[Table, str], int]) -> None:
    settings: dict[str, Setting] = {}
    for key, value in data.items():
        if isinstance(value, dict) and not _value_table(table, key):
            _gather(config, value, (*table, key), lines)
            continue
        name = key.replace("_", "-")
        if name in settings:
            raise ConfigError(f"{config.path}:{lines.get((table, key), 1)}: "
                              f"{'.'.join((*table, key))}: set twice (as - and _)")
        settings[name] = Setting(value, lines.get((table, key), 1))
    if settings:
        config.tables[table] = settings


def _value_table(table: Table, key: str) -> bool:
    """Whether `key` of `table` is one setting whose value is a table (a
    preset's template variables, an MCP server's environment and headers,
    which keep their own spelling) rather than a table of settings."""
    name = key.replace("_", "-")
    if table[:1] == ("presets",) and len(table) == 2:
        return name == "chat-template-kwargs"
    return table[:2] == ("mcp", "servers") and len(table) == 3 and name in ("env", "headers")


def _key_lines(text: str, headers: dict[Table, int]) -> dict[tuple[Table, str], int]:
    """Where each `key =` of each [table] is, for the error messages
    (tomllib gives values, not lines); each header's line goes in `headers`."""
    found: dict[tuple[Table, str], int] = {}
    table: Table = ()
    for n, line in enumerate(text.splitlines(), 1):
        header = _HEADER.match(line)
        if header:
            table = tuple(part.strip().strip("\"'") for part in header.group(1).split("."))
            headers.setdefault(table, n)
            continue
        key = _KEY.match(line)
        if key:
            found.setdefault((table, next(g for g in key.groups() if g)), n)
    return found
