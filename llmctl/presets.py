"""Presets, the config file's `[presets.NAME]` tables: a model plus sampling
defaults, a system prompt, a chat-template override and its variables,
usable wherever a model name is (every API's `model`, `chat`, `run`,
`serve`). Presets over one model share its one loaded copy and its prefix
cache: the server leases the preset's model and layers the preset over its
own defaults; a request's own fields win over both.

    [presets.coder-strict]
    model = "qwen2.5-coder-0.5b"
    system = "You are a terse senior engineer."
    temperature = 0
    max-tokens = 256

Every mistake is one line naming the file, the line and the key
(ConfigFile.error)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from llmctl.config_file import ConfigFile, load_config

PRESETS = "presets"
# A preset name is typed where a model name is: no ':' (Ollama's tag) or '/'.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Preset key -> SamplingParams field.
SAMPLING_KEYS = {"temperature": "temperature", "top-p": "top_p", "top-k": "top_k",
                 "min-p": "min_p", "repeat-penalty": "repeat_penalty",
                 "presence-penalty": "presence_penalty",
                 "frequency-penalty": "frequency_penalty", "seed": "seed",
                 "max-tokens": "max_tokens", "stop": "stop"}
_TEXT_KEYS = ("model", "description", "system", "template")
KWARGS_KEY = "chat-template-kwargs"
# Variables the renderer itself gives every template: a preset may not replace them.
RESERVED_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")
# Roles that already carry a system prompt, so the preset's is not added.
_SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class Preset:
    """One `[presets.NAME]` table, validated."""

    name: str
    model: str                          # a registry or store name, or a .gguf path
    description: str = ""
    system: str | None = None           # for a conversation that has no system message
    sampling: dict[str, Any] = field(default_factory=dict)  # SamplingParams fields it sets
    template: str | None = None         # Jinja chat template text over the model's
    template_kwargs: dict[str, Any] = field(default_factory=dict)   # its extra variables

    def params(self, over: Any) -> Any:
        """SamplingParams `over` with this preset's fields set. Raises
        InvalidParams only for values load_presets would have refused."""
        return over.replace(**self.sampling)

    def with_system(self, messages: Any) -> Any:
        """`messages` with the preset's system prompt first when it has
        one and they carry none; anything not a list of messages as it
        is (the template's validation reports it). Raises nothing."""
        if not self.system or not isinstance(messages, list) or any(
                isinstance(m, dict) and m.get("role") in _SYSTEM_ROLES for m in messages):
            return messages
        return [{"role": "system", "content": self.system}, *messages]


def load_presets(config: ConfigFile) -> dict[str, Preset]:
    """The presets of `config` by name. Raises ConfigError (file:line:key)
    for a key no preset has, a value of the wrong type or out of range, a
    missing model, a model that is another preset, a template that is not
    valid Jinja, and a name that is not a plain name or is also a
    models.toml model's."""
    tables = {t: s for t, s in config.tables.items() if t[:1] == (PRESETS,)}
    for table in config.headers:
        if table[:1] == (PRESETS,):
            tables.setdefault(table, {})
    names = {t[1] for t in tables if len(t) == 2}
    presets = {}
    for table in tables:
        if len(table) != 2:
            key = next(iter(tables[table]), "")
            raise config.error(table, key, "a preset is a table of its own: [presets.NAME]")
        presets[table[1]] = _preset(config, table, names)
    return presets


def find_preset(name: str | None, config: ConfigFile | None = None) -> Preset | None:
    """The preset called `name` in `config` (default: the config file);
    None for None or a name that is no preset's. Raises what load_presets
    raises."""
    if not name:
        return None
    return load_presets(config or load_config()).get(name)


def _preset(config: ConfigFile, table: tuple[str, ...], names: set[str]) -> Preset:
    settings = config.tables.get(table, {})
    name = table[1]
    first = next(iter(settings), "model")
    if not _NAME.fullmatch(name):
        raise config.error(table, first, f"{name!r} is not a preset name (letters, digits, "
                                         ". _ -, starting with a letter or digit)")
    _check_not_registry(config, table, first)
    for key in settings:
        if key not in SAMPLING_KEYS and key not in _TEXT_KEYS and key != KWARGS_KEY:
            raise config.error(table, key, "no preset has this key; one has model, "
                                           f"{', '.join(_TEXT_KEYS[1:])}, "
                                           f"{', '.join(SAMPLING_KEYS)} and {KWARGS_KEY}")
    text = {key: _text(config, table, key) for key in _TEXT_KEYS if key in settings}
    if not text.get("model"):
        raise config.error(table, "model", "a preset needs a model (a models.toml name, "
                                           "a store name or a .gguf path)")
    if text["model"] in names:
        raise config.error(table, "model", f"{text['model']!r} is a preset; a preset's "
                                           "model must be a model")
    if "template" in text:
        _check_template(config, table, text["template"])
    return Preset(name, text["model"], text.get("description", ""), text.get("system"),
                  _sampling(config, table), text.get("template"), _kwargs(config, table))


def _check_not_registry(config: ConfigFile, table: tuple[str, ...], key: str) -> None:
    from llmctl.errors import LlmctlError
    from llmctl.store.registry import load_registry

    try:
        clash = load_registry().get(table[1]) is not None
    except LlmctlError:         # no registry: nothing to clash with
        return
    if clash:
        raise config.error(table, key, f"{table[1]!r} is a models.toml model; name the "
                                       "preset otherwise")


def _text(config: ConfigFile, table: tuple[str, ...], key: str) -> str:
    value = config.tables[table][key].value
    if not isinstance(value, str):
        raise config.error(table, key, f"must be a string, got {_kind(value)}")
    return value


def _sampling(config: ConfigFile, table: tuple[str, ...]) -> dict[str, Any]:
    """The preset's sampling fields, checked as SamplingParams checks them."""
    from llmctl.errors import InvalidParams
    from llmctl.runtime.sampling import SamplingParams

    settings = config.tables.get(table, {})
    values = {}
    for key, name in SAMPLING_KEYS.items():
        if key not in settings:
            continue
        value = settings[key].value
        if name == "stop" and isinstance(value, str):
            value = [value]
        if name == "stop" and not (isinstance(value, list)
                                   and all(isinstance(s, str) for s in value)):
            raise config.error(table, key, "must be a string or a list of strings")
        values[name] = tuple(value) if name == "stop" else value
        try:
            SamplingParams(**{name: values[name]})
        except InvalidParams as e:
            raise config.error(table, key, f"bad value {value!r}: {e.message}") from None
    return values


def _kwargs(config: ConfigFile, table: tuple[str, ...]) -> dict[str, Any]:
    setting = config.tables.get(table, {}).get(KWARGS_KEY)
    if setting is None:
        return {}
    if not isinstance(setting.value, dict):
        raise config.error(table, KWARGS_KEY, "must be a table of template variables, "
                                              "e.g. { enable_thinking = false }")
    reserved = [k for k in setting.value if k in RESERVED_VARIABLES]
    if reserved:
        raise config.error(table, KWARGS_KEY, f"{reserved[0]!r} is set by llmctl itself "
                                              "for every template")
    return dict(setting.value)


def _check_template(config: ConfigFile, table: tuple[str, ...], source: str) -> None:
    from llmctl.errors import TemplateError
    from llmctl.runtime.formats.template import ChatTemplate

    if not source.strip():
        raise config.error(table, "template", "must be Jinja chat template text, not empty")
    try:
        ChatTemplate(source)
    except TemplateError as e:
        raise config.error(table, "template", str(e.message).splitlines()[0]) from None


def _kind(value: Any) -> str:
    return {bool: "a boolean", int: "an integer", float: "a number", list: "an array",
            dict: "a table"}.get(type(value), type(value).__name__)
