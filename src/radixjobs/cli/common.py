"""Helpers every ``radixjobs`` command shares: common options, the database, output."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import psycopg

from radixjobs import migrate, output
from radixjobs.config import Target, open_target
from radixjobs.config_file import bad_value
from radixjobs.db import bound_lock_waits, connect
from radixjobs.engine.batches import BATCH_MAX
from radixjobs.errors import RadixError
from radixjobs.fairness import LONG_ATTEMPT_S, reserved_slots

F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class Options:
    dsn: str | None
    home: Path | None
    json: bool
    dsns: tuple[str, ...] = ()  # every target (``serve --dsn`` repeated); else () or (dsn,)


def common_options(func: F) -> F:
    """--dsn, --home and --json on every command (also accepted before the command name)."""
    return _common_options(func, many_dsns=False)


def many_dsns_options(func: F) -> F:
    """common_options whose --dsn may be repeated (``serve``: several clusters); the file key ``dsn`` takes a
    list. The environment (RADIXJOBS_DSN, read by the root group) is one DSN: it is not split."""
    return _common_options(func, many_dsns=True)


def _common_options(func: F, *, many_dsns: bool) -> F:
    if many_dsns:
        dsn_option = click.option(
            "--dsn", multiple=True, metavar="DSN",
            help="PostgreSQL DSN or URI; repeat it to serve several clusters (default: RADIXJOBS_DSN, libpq "
                 "PG* variables, else the embedded server).")
    else:
        dsn_option = click.option(
            "--dsn", envvar="RADIXJOBS_DSN", default=None, metavar="DSN",
            help="PostgreSQL DSN or URI (default: libpq PG* variables, else the embedded server).")

    @dsn_option
    @click.option("--home", envvar="RADIXJOBS_HOME", default=None, metavar="DIR",
                  type=click.Path(file_okay=False, path_type=Path),
                  help="Data directory of the embedded server.")
    @click.option("--json", "as_json", is_flag=True, default=False, help="Print JSON.")
    @click.pass_context
    def wrapper(ctx: click.Context, /, dsn: str | tuple[str, ...] | None, home: Path | None, as_json: bool,
                **kwargs: Any) -> Any:
        parent: Options = ctx.find_object(Options) or Options(None, None, False)
        own = (tuple(dsn) or None) if isinstance(dsn, tuple | list) else dsn
        chosen = _flag_wins(ctx, "dsn", own, parent.dsn)
        dsns = tuple(chosen) if isinstance(chosen, tuple) else ((chosen,) if chosen is not None else ())
        opts = Options(dsns[0] if dsns else None, _flag_wins(ctx, "home", home, parent.home),
                       as_json or parent.json, dsns)
        return ctx.invoke(func, opts, **kwargs)

    functools.update_wrapper(wrapper, func)
    return wrapper  # type: ignore[return-value]


def _flag_wins(ctx: click.Context, name: str, own: Any, parent: Any) -> Any:
    """Command line (the command's own flag, then the global one before the command), then the config file
    (``serve --config``: click's default map), then the environment, which fills both options alike."""
    source = click.core.ParameterSource
    parent_source = ctx.find_root().get_parameter_source(name)
    if own is not None and ctx.get_parameter_source(name) is source.COMMANDLINE:
        return own
    if parent is not None and parent_source is source.COMMANDLINE:
        return parent
    if own is not None and ctx.get_parameter_source(name) is source.DEFAULT_MAP:
        return own
    return parent if parent is not None else own


@contextlib.contextmanager
def database(opts: Options, *, need_schema: bool = True, pinned: bool = True,
             embedded_schema: bool = False) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the target; the embedded default gets the schema installed on the way (when the
    command needs it, or ``embedded_schema``).

    Pinned (search_path = pg_catalog, pg_temp) and with lock waits bounded (RADIXJOBS_LOCK_TIMEOUT) unless it
    runs the user's own SQL text (``pinned=False``: the user's search_path and lock_timeout).
    """
    with open_target(opts.dsn, opts.home) as target, connect(target.dsn, pinned=pinned) as conn:
        if pinned:
            bound_lock_waits(conn)
        if need_schema or (embedded_schema and target.embedded is not None):
            ensure_schema(conn, target)
        yield conn


def ensure_schema(conn: psycopg.Connection[Any], target: Target) -> None:
    """The embedded server gets the schema installed when it is behind; any other database is checked.

    An up-to-date schema is only read (no install, so no lock: a command never waits on an install).
    """
    if target.embedded is not None and migrate.installed_version(conn) != migrate.code_version():
        migrate.install(conn)
    else:
        migrate.check_ready(conn)


def command_name() -> str:
    """How to run this radixjobs again from the same shell: ``radixjobs`` when that name on the PATH is this
    program, else the path it was started by (``.venv/bin/radixjobs`` after ``make run``), else
    ``python -m radixjobs`` with this interpreter."""
    import os
    import shlex
    import shutil
    import sys

    started = sys.argv[0] if sys.argv else ""
    if not started or started.endswith("__main__.py") or not os.path.isfile(started):
        return f"{shlex.quote(_shown_path(sys.executable))} -m radixjobs"
    on_path = shutil.which("radixjobs")
    if on_path is not None and os.path.realpath(on_path) == os.path.realpath(started):
        return "radixjobs"
    return shlex.quote(_shown_path(started))


def _shown_path(path: str) -> str:
    """``path`` relative to the working directory when it is below it (as typed there), else absolute."""
    import os

    absolute = os.path.abspath(path)
    relative = os.path.relpath(absolute)
    return relative if not relative.startswith("..") and os.sep in relative else absolute


def emit(opts: Options, value: Any, human: str) -> None:
    click.echo(output.to_json(value) if opts.json else human)


def max_per_principal_option(default: str, counted: str = "in a database, all nodes counted") -> Callable[[F], F]:
    """``--max-per-principal N`` (or RADIXJOBS_MAX_PER_PRINCIPAL; the flag wins): see docs/security.md."""
    return click.option(
        "--max-per-principal", envvar="RADIXJOBS_MAX_PER_PRINCIPAL", default=None, type=click.IntRange(min=0),
        metavar="N", help=f"Attempts one principal (RUN AS role) may have running {counted}; 0: no cap. "
                          f"Default: {default}. Env: RADIXJOBS_MAX_PER_PRINCIPAL.")


def reserve_options(slots: str) -> Callable[[F], F]:
    """``--reserved-slots N`` and ``--long-attempt SECONDS`` (or RADIXJOBS_RESERVED_SLOTS and
    RADIXJOBS_LONG_ATTEMPT; a flag wins): see docs/security.md "Fair claims"."""
    def decorate(function: F) -> F:
        function = click.option(
            "--long-attempt", envvar="RADIXJOBS_LONG_ATTEMPT", default=LONG_ATTEMPT_S, show_default=True,
            type=click.FloatRange(0, 604_800, min_open=True), metavar="SECONDS",
            help="An attempt whose job's timeout is above this is long: long attempts never hold the reserved "
                 "slots. Env: RADIXJOBS_LONG_ATTEMPT.")(function)
        return click.option(
            "--reserved-slots", envvar="RADIXJOBS_RESERVED_SLOTS", default=None, type=click.IntRange(min=0),
            metavar="N", help=f"Slots of {slots} kept for attempts that are not long (0: none; all of them: no "
                              f"long attempt runs here). Default: a quarter of them, at least 1 when there are 2 "
                              f"or more. Env: RADIXJOBS_RESERVED_SLOTS.")(function)
    return decorate


def check_reserved_slots(reserved: int | None, slots: int, slots_flag: str) -> None:
    """A usage error naming both flags when the reserve is not one of the slots (fairness.reserved_slots)."""
    try:
        reserved_slots(slots, reserved)
    except ValueError:
        raise bad_value("reserved_slots", f"{reserved} is more than the {slots} slots of {slots_flag}") from None


def tick_batch_option(function: F) -> F:
    """``--tick-batch N`` (or RADIXJOBS_TICK_BATCH; the flag wins): engine/batches.py."""
    return click.option(
        "--tick-batch", envvar="RADIXJOBS_TICK_BATCH", default=BATCH_MAX, show_default=True,
        type=click.IntRange(1, BATCH_MAX), metavar="N",
        help="Under a backlog, run up to N due ticks of one principal, owner and procedure in one transaction "
             "(1: each tick alone; docs/guarantees.md#tick-batches). Env: RADIXJOBS_TICK_BATCH.")(function)


def input_name(file: Any) -> str:
    """How an input file is named in errors: its path, or "standard input"."""
    name = getattr(file, "name", None)
    return "standard input" if not isinstance(name, str) or name in ("-", "<stdin>") else name


def decode_utf8(data: bytes, source: str) -> str:
    """Input text as UTF-8, or a one-line error naming the source and the byte offset of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise RadixError(f"{source} is not valid UTF-8: byte 0x{data[exc.start]:02x} at line {line}, column "
                         f"{column} (offset {exc.start}): {exc.reason}") from None
