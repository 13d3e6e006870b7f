"""`llmctl config show`, and the config file (llmctl/config_file.py) handed to
click as the invoked command's default map: click then takes a flag first, an
`LLMCTL_*` variable second, the file third and the built-in default last.

A key in a command's own table must be one of its flags (a typo is a one-line
error naming the file, line and key), and every value is checked as the flag
would check it before the command runs. A top-level key applies to every
command that has the flag; the others ignore it."""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Any, Iterator, Optional

import typer
from rich.markup import escape
from typing_extensions import Annotated

from llmctl import settings
from llmctl.cli import options as o
from llmctl.cli.common import handle_errors, out, print_json
from llmctl.cli.tables import fitted
from llmctl.config_file import ConfigError, ConfigFile, Setting, Table, load_config

if TYPE_CHECKING:
    # What click hands the callbacks: typer.Context is only its annotation-time subclass.
    from typer._click import Context

# Not settings: they print or leave instead of configuring the command.
_NOT_SETTINGS = {"help", "version", "install_completion", "show_completion"}


def _params(cmd: Any) -> Iterator[Any]:
    for param in cmd.params:
        if param.name not in _NOT_SETTINGS and param.expose_value:
            yield param


def _find(cmd: Any, key: str) -> tuple[Any, bool] | None:
    """The parameter `key` names (a long name without dashes, or an
    argument's name) and whether it is a flag's negative (`no-x` of
    `--x/--no-x`); None when `cmd` has none."""
    for param in _params(cmd):
        if f"--{key}" in param.opts or (param.param_type_name == "argument"
                                        and param.name.replace("_", "-") == key):
            return param, False
        if f"--{key}" in getattr(param, "secondary_opts", ()):
            return param, True
    return None


def _value(config: ConfigFile, ctx: Context, table: Table, key: str, setting: Setting,
           found: tuple[Any, bool]) -> Any:
    param, negative = found
    value = setting.value
    if negative:
        if not isinstance(value, bool):
            raise config.error(table, key, "must be true or false")
        value = not value
    try:
        param.process_value(ctx, value)
    except typer.Exit:
        raise
    except Exception as e:  # click's and typer's BadParameter, pydantic's errors
        raise config.error(table, key, f"bad value {value!r}: "
                                       f"{getattr(e, 'message', e)}".splitlines()[0]) from None
    return value


def _table_of(config: ConfigFile, path: Table, key: str) -> Table:
    """The innermost table at or above `path` that sets `key`."""
    for depth in range(len(path), -1, -1):
        if key in config.tables.get(path[:depth], {}):
            return path[:depth]
    return ()


def command_map(config: ConfigFile, ctx: Context, cmd: Any, path: Table) -> dict[str, Any]:
    """The default map for `cmd` at `path` (a group's holds its
    subcommands'). Raises ConfigError for a key of `cmd`'s own table that
    is none of its flags, and for a value its flag refuses."""
    subcommands = getattr(cmd, "commands", None)
    if subcommands is None:
        return {name: value for name, (value, _) in _leaf_map(config, ctx, cmd, path).items()}
    for key in config.tables.get(path, {}):
        if path and not any(_find(sub, key) for sub in subcommands.values()):
            raise config.error(path, key, f"no `{' '.join(path)}` command has --{key}")
    return {name: command_map(config, ctx, sub, (*path, name)) for name, sub in subcommands.items()}


def _leaf_map(config: ConfigFile, ctx: Context, cmd: Any,
              path: Table) -> dict[str, tuple[Any, Setting]]:
    """A command's settings from the file: parameter name -> (value, the
    setting it came from)."""
    found_map: dict[str, tuple[Any, Setting]] = {}
    for key, setting in config.for_command(path).items():
        table = _table_of(config, path, key)
        found = _find(cmd, key)
        if found is None:
            if table == path:
                raise config.error(table, key, f"`llmctl {' '.join(path)}` has no --{key}")
            continue
        found_map[found[0].name] = (_value(config, ctx, table, key, setting, found), setting)
    return found_map


def _check_tables(config: ConfigFile, group: Any) -> None:
    """Every table names a command, or is a valid preset. Raises ConfigError."""
    from llmctl.presets import PRESETS, load_presets

    load_presets(config)
    for table, keys in config.tables.items():
        if table[:1] == (PRESETS,) or table[:2] == ("mcp", "servers"):
            continue        # presets and MCP servers: their own modules check them
        cmd: Any = group        # the group, then a command or subgroup, or None
        for depth, name in enumerate(table):
            cmd = getattr(cmd, "commands", {}).get(name)
            if depth == 0 and len(table) > 1 and hasattr(cmd, "module"):
                cmd = group.load(cmd.module)[name]      # a group not imported yet
            if cmd is None:
                raise config.error(table, next(iter(keys)),
                                   f"[{'.'.join(table[:depth + 1])}] names no command")


def apply_config(ctx: typer.Context) -> None:
    """Give the invoked command the config file's defaults. Raises
    ConfigError for a bad file, table, key or value."""
    config = load_config()
    if not (config.tables or config.headers) or not ctx.invoked_subcommand:
        return
    from llmctl.cli.app import LazyGroup

    group = ctx.command
    assert isinstance(group, LazyGroup)     # the root: app's group
    _check_tables(config, group)
    name = ctx.invoked_subcommand
    ctx.default_map = {name: command_map(config, ctx, group.commands[name], (name,))}


def _leaves(cmd: Any, path: Table) -> Iterator[tuple[Table, Any]]:
    subcommands = getattr(cmd, "commands", None)
    if subcommands is None:
        yield path, cmd
        return
    for name, sub in subcommands.items():
        yield from _leaves(sub, (*path, name))


def _effective(config: ConfigFile, ctx: Context, path: Table, cmd: Any) -> dict[str, dict]:
    """Each setting of `cmd`: its value and where it came from."""
    mapped = _leaf_map(config, ctx, cmd, path)
    rows = {}
    for param in _params(cmd):
        key = (param.opts[0].lstrip("-") if param.param_type_name == "option"
               else param.name.replace("_", "-"))
        env = param.envvar if isinstance(param.envvar, str) else None
        from_env = settings.flag_variable(env) if env else None
        if from_env is not None:
            value, source = from_env, f"env {env}"
        elif param.name in mapped:
            value, setting = mapped[param.name]
            source = setting.where(config.path)
        else:
            value, source = param.default, "default"
        rows[key] = {"value": value.value if isinstance(value, Enum) else value,
                     "source": source}
    return rows


def _presets(config: ConfigFile) -> dict[str, dict]:
    """The config file's presets as `config show` lists them. Raises
    ConfigError for a bad preset."""
    from llmctl.presets import PRESETS, load_presets

    return {name: {"model": p.model, "description": p.description,
                   "source": f"{config.path}:{config.headers.get((PRESETS, name), 1)}"}
            for name, p in load_presets(config).items()}


def _print_presets(presets: dict[str, dict]) -> None:
    for name, preset in presets.items():
        about = f" ({preset['description']})" if preset["description"] else ""
        out.print(f"preset {name}: {preset['model']}{about}", markup=False)


@handle_errors
def show(
    context: typer.Context,
    command: Annotated[Optional[list[str]], typer.Argument(
        help="A command (`serve`, `cache ls`): all its settings. Default: every "
             "setting of every command that is not at its built-in default.",
        show_default=False)] = None,
    json: o.Json = False,
) -> None:
    """Show the settings in effect and where each comes from.

    A flag wins over an LLMCTL_* variable, which wins over the config file
    (~/.config/llmctl/config.toml, or LLMCTL_CONFIG), which wins over the
    built-in default.

    Example: llmctl config show serve
    """
    from llmctl.cli.app import COMMANDS, LazyGroup

    root = context.find_root()
    group = root.command
    assert isinstance(group, LazyGroup)     # the root: app's group
    for module in {module for module, _ in COMMANDS.values()}:
        group.load(module)
    config = load_config()
    _check_tables(config, group)
    for name, cmd in group.commands.items():
        command_map(config, root, cmd, (name,))     # every table checked, not only one
    wanted = tuple(command or ())
    report = {}
    for path, cmd in _leaves(group, ()):
        if path[0] == "config" or (wanted and path != wanted):
            continue
        rows = _effective(config, root, path, cmd)
        if not wanted:
            rows = {k: r for k, r in rows.items() if r["source"] != "default"}
        if rows or wanted:
            report[" ".join(path)] = rows
    if wanted and not report:
        raise ConfigError(f"no command `{' '.join(wanted)}`")
    presets = _presets(config)
    if json:
        print_json({"file": str(config.path), "exists": config.exists, "commands": report,
                    **({"presets": presets} if presets else {})})
        return
    out.print(f"config file: {config.path}{'' if config.exists else ' (none)'}", markup=False)
    _print_presets(presets)
    if not any(report.values()):
        out.print("every setting is at its built-in default")
        return
    cells = [[name, key, escape(str(row["value"])), escape(row["source"])]
             for name, rows in report.items() for key, row in rows.items()]
    out.print(fitted(("COMMAND", "SETTING", "VALUE", "SOURCE"), cells, out,
                     whole=("COMMAND", "SETTING")))


def register(app: typer.Typer) -> None:
    config_app = typer.Typer(help="Show the settings in effect and where each comes from.\n\n"
                                  "Example: llmctl config show serve",
                             no_args_is_help=True)
    config_app.command("show")(show)
    app.add_typer(config_app, name="config")
