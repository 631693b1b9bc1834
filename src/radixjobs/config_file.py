"""``--config FILE``: a TOML file whose top-level keys are a command's long flag names.

Invariants:
- The mapping is generic over the command's options: every option with a long flag (``--per-database-concurrency``)
  has the key ``per-database-concurrency`` (spelled as the flag, dashes; an underscore spelling is an unknown key
  with a hint). A flag added to the command later works in the file without edits here.
- Precedence: command line > file > environment (``envvar=``) > defaults. A flag given before the command name
  (``radixjobs --dsn X serve``) counts as command line too.
- Every problem is one line naming the file, the line and the key (or the TOML line): unknown keys (with the
  nearest known key when one is close), wrong types, values out of range, unreadable files, invalid TOML.
  Nothing is applied from a file with a problem. A value the command itself refuses later (``serve``'s
  ``http`` address) is reported the same way when it came from the file (``bad_value``), not as its flag.
- A file that holds a secret (a DSN's password, the console token) is refused when every user may read it and
  warned about when its group may (radixjobs.config_exposure); the warning is kept in ``ctx.meta`` for the
  caller to log, at start and on every reload, since logging is set up after the options are parsed.
- A repeatable flag's key takes a list or one value (``serve``'s ``dsn = ["…", "…"]``: several clusters). A
  single-valued key also takes a one-element list; more elements are refused.
"""

from __future__ import annotations

import difflib
import os
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from radixjobs.config_exposure import judge

F = TypeVar("F", bound=Callable[..., Any])

CONFIG_META = "radixjobs.config"  # ctx.meta key: the Loaded file
ARGS_META = "radixjobs.args"  # ctx.meta key: the command's own arguments (to parse them again on reload)
NOT_IN_FILE = frozenset({"config", "help"})


class ConfigFileError(click.ClickException):
    """A problem with the configuration file: printed as one line, exit code 2."""

    exit_code = 2

    def format_message(self) -> str:
        return self.message


def key_of(param: click.Parameter) -> str | None:
    """The file key of an option: its first long flag without the dashes; None when it has none."""
    if not isinstance(param, click.Option) or param.name in NOT_IN_FILE:
        return None
    for opt in param.opts:
        if opt.startswith("--"):
            return opt[2:]
    return None


def keys_of(command: click.Command) -> dict[str, click.Option]:
    return {key: param for param in command.params if (key := key_of(param)) is not None
            and isinstance(param, click.Option)}


def _kind(param: click.Option) -> tuple[tuple[type, ...], str]:
    """The TOML types an option's value may have, and their name for an error."""
    if param.is_flag and not param.multiple and param.count is False:
        return (bool,), "true or false"
    if param.count:
        return (int,), "an integer"
    if isinstance(param.type, click.types.IntParamType):
        return (int,), "an integer"
    if isinstance(param.type, click.types.FloatParamType):
        return (int, float), "a number"
    if isinstance(param.type, click.types.BoolParamType):
        return (bool,), "true or false"
    return (str,), "a string"


# A top-level key (bare or quoted) or a table header, at the start of a line: where a key is, for an error.
_KEY_LINE = re.compile(r"""^[ \t]*(?:\[+[ \t]*)?(?:"([^"\n]*)"|'([^'\n]*)'|([A-Za-z0-9_-]+))""")


def key_lines(text: str) -> dict[str, int]:
    """The line (1-based) of each top-level key and table of a TOML text, the first when repeated."""
    lines: dict[str, int] = {}
    in_table = False
    for number, line in enumerate(text.splitlines(), start=1):
        found = _KEY_LINE.match(line)
        if found is None or (in_table and not line.lstrip().startswith("[")):
            continue
        in_table = in_table or line.lstrip().startswith("[")
        lines.setdefault(next(group for group in found.groups() if group is not None), number)
    return lines


def where(path: Path, key: str, lines: dict[str, int]) -> str:
    """``config file PATH, line N: key 'KEY'`` (without the line when it is not known)."""
    line = f", line {lines[key]}" if key in lines else ""
    return f"config file {path}{line}: key '{key}'"


def _check(ctx: click.Context, path: Path, key: str, param: click.Option, value: Any,
           lines: dict[str, int]) -> Any:
    """The value, converted and validated as the command line would be; ConfigFileError otherwise."""
    where_key = where(path, key, lines)
    types, name = _kind(param)

    def one(item: Any) -> Any:
        if (isinstance(item, bool) and bool not in types) or not isinstance(item, types):
            raise ConfigFileError(f"{where_key}: expected {name}, got {_toml_type(item)}")
        try:
            return param.type.convert(item, param, ctx)
        except click.BadParameter as exc:
            raise ConfigFileError(f"{where_key}: {exc.message}") from None

    if param.multiple:
        items = value if isinstance(value, list) else [value]
        return tuple(one(item) for item in items)
    if isinstance(value, list):
        if len(value) != 1:
            raise ConfigFileError(f"{where_key}: takes one value; a list of {len(value)} is not supported")
        value = value[0]
    if param.is_flag and not param.count:
        one(value)
        return value
    return one(value)


def _toml_type(value: Any) -> str:
    for kind, name in ((bool, "true/false"), (int, "an integer"), (float, "a number"), (str, "a string"),
                       (list, "a list"), (dict, "a table")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


@dataclass(frozen=True)
class Loaded:
    """A configuration file read and validated: ``{param name: value}``, and what to warn about it."""

    path: Path
    values: dict[str, Any]
    warning: str | None = None
    keys: dict[str, str] = field(default_factory=dict)  # param name -> the key it was given as
    lines: dict[str, int] = field(default_factory=dict)  # key -> its line in the file


def load(ctx: click.Context, command: click.Command, path: Path) -> Loaded:
    """Read and validate ``path`` for ``command``."""
    try:
        with path.open("rb") as file:
            status = os.fstat(file.fileno())  # the mode of the file read, not of a later one by that name
            text = file.read().decode("utf-8")
    except OSError as exc:
        raise ConfigFileError(f"config file {path}: cannot read it: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigFileError(f"config file {path}: not UTF-8 text") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigFileError(f"config file {path}: invalid TOML: {exc}") from None
    known = keys_of(command)
    exposure = judge(path, status, document, known)
    if exposure is not None and exposure.refused:
        raise ConfigFileError(exposure.message)
    values: dict[str, Any] = {}
    keys: dict[str, str] = {}
    lines = key_lines(text)
    for key, value in document.items():
        param = known.get(key)
        if param is None:
            line = f", line {lines[key]}" if key in lines else ""
            raise ConfigFileError(f"config file {path}{line}: unknown key '{key}'{_suggestion(key, value, known)}; the "
                                  f"keys are the long flags of `{ctx.command_path}` without the dashes")
        assert param.name is not None
        values[param.name] = _check(ctx, path, key, param, value, lines)
        keys[param.name] = key
    return Loaded(path, values, exposure.message if exposure is not None else None, keys, lines)


def _suggestion(key: str, value: Any, known: dict[str, click.Option]) -> str:
    """`` (did you mean 'KEY'?)`` for the known key nearest a misspelt one (dashes for underscores first);
    none for a table (``[serve]``: the keys are top-level, not a misspelt flag)."""
    dashed = key.replace("_", "-")
    if isinstance(value, dict):
        return ""
    close = [dashed] if dashed in known else difflib.get_close_matches(dashed, list(known), n=1, cutoff=0.75)
    return f" (did you mean '{close[0]}'?)" if close else ""


def bad_value(name: str, message: str) -> click.ClickException:
    """The error for a value of option ``name`` the command refused after parsing: naming the file, line and
    key when the value came from the configuration file, else the flag (and its environment variable)."""
    ctx = click.get_current_context(silent=True)
    if ctx is None:
        return click.BadParameter(message, param_hint=f"--{name.replace('_', '-')}")
    loaded = ctx.meta.get(CONFIG_META)
    source = ctx.get_parameter_source(name)
    if isinstance(loaded, Loaded) and name in loaded.keys and source is ParameterSource.DEFAULT_MAP:
        return ConfigFileError(f"{where(loaded.path, loaded.keys[name], loaded.lines)}: {message}")
    param = next((p for p in ctx.command.params if p.name == name), None)
    hint = f"--{key_of(param) or name}" if param is not None else f"--{name.replace('_', '-')}"
    if source is ParameterSource.ENVIRONMENT and isinstance(param, click.Option) and isinstance(param.envvar, str):
        hint = f"{hint} (from {param.envvar})"
    return click.BadParameter(message, ctx=ctx, param_hint=hint)


def _load_callback(ctx: click.Context, _: click.Parameter, value: Path | None) -> Path | None:
    """Eager: runs before every other option, so the file's values are in place when they are resolved."""
    if value is not None:
        loaded = load(ctx, ctx.command, value)
        ctx.meta[CONFIG_META] = loaded
        ctx.default_map = {**(ctx.default_map or {}), **loaded.values}
    return value


def config_warning(ctx: click.Context) -> str | None:
    """The warning about the configuration file last read for ``ctx`` (group-readable with a secret), if any."""
    loaded = ctx.meta.get(CONFIG_META)
    return loaded.warning if isinstance(loaded, Loaded) else None


def config_option(func: F) -> F:
    """``--config FILE`` (or ``RADIXJOBS_CONFIG``)."""
    return click.option("--config", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        envvar="RADIXJOBS_CONFIG", metavar="FILE", is_eager=True, expose_value=False,
                        callback=_load_callback,
                        help="TOML file whose keys are these flags' names (flags given here win over it; it "
                             "wins over environment variables). Env: RADIXJOBS_CONFIG.")(func)


class ConfigFileCommand(click.Command):
    """A command with ``--config``: puts the file between the command line and the environment."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta[ARGS_META] = list(args)  # ctx.meta is shared along the context chain: set afresh here
        ctx.meta.pop(CONFIG_META, None)
        rest = super().parse_args(ctx, args)
        loaded = ctx.meta.get(CONFIG_META)
        if loaded is None:
            return rest
        for name, value in loaded.values.items():
            source = ctx.get_parameter_source(name)
            parent = ctx.parent
            if (parent is not None and name in parent.params
                    and parent.get_parameter_source(name) is ParameterSource.COMMANDLINE):
                ctx.params[name] = None  # given before the command name: the command line wins
                ctx.set_parameter_source(name, ParameterSource.DEFAULT)
            elif source is ParameterSource.ENVIRONMENT:  # the file wins over the environment
                param = next(p for p in self.params if p.name == name)
                ctx.params[name] = param.process_value(ctx, value)
                ctx.set_parameter_source(name, ParameterSource.DEFAULT_MAP)
        return rest

    def reparse(self, ctx: click.Context) -> tuple[dict[str, Any], str | None]:
        """The parameters again from the same arguments (the file read anew), and the file's warning: for a
        reload.

        Raises click.ClickException (ConfigFileError included) for a problem; nothing is applied then."""
        again = self.make_context(ctx.info_name, list(ctx.meta.get(ARGS_META, [])), parent=ctx.parent)
        return dict(again.params), config_warning(again)
