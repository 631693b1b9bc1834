"""``radixjobs sql`` (scripts with job DDL) and ``radixjobs install`` (the schema)."""

from __future__ import annotations

import sys
from typing import Any

import click

from radixjobs import migrate, output
from radixjobs.cli.common import Options, common_options, database, decode_utf8, emit, input_name


@click.command("sql")
@click.option("-c", "--command", "texts", multiple=True, metavar="TEXT",
              help="SQL text to run (repeatable: run in order, as psql does).")
@click.option("-f", "--file", "file", default=None, type=click.File("rb"),
              help="SQL script to run ('-' for standard input).")
@common_options
def sql_command(opts: Options, texts: tuple[str, ...], file: Any) -> None:
    """Run SQL (and job DDL) from -c TEXT (repeatable), -f FILE or standard input, statement by statement.

    Plain SQL runs on any database (CREATE DATABASE, CREATE ROLE before `radixjobs install`); a script with
    job DDL needs the radix schema, checked before its first statement runs."""
    from radixjobs.scripts import has_job_statement, run_script

    if texts and file is not None:
        raise click.UsageError("give either -c or -f, not both")
    if not texts:
        stream = file if file is not None else sys.stdin.buffer
        texts = (decode_utf8(stream.read(), input_name(file)),)
    need_schema = any(has_job_statement(text) for text in texts)
    # the user's SQL, in the user's own search_path; the embedded server gets its schema either way
    with database(opts, pinned=False, need_schema=need_schema, embedded_schema=True) as conn:
        for result in (result for text in texts for result in run_script(conn, text)):
            if opts.json:
                if result.returns_rows:
                    click.echo(output.to_json(result.records()))
            elif result.returns_rows:
                click.echo(output.render_table(result.columns, result.rows))
            elif result.status:
                click.echo(result.status)


@click.command("install")
@common_options
def install_command(opts: Options) -> None:
    """Create or upgrade the radix schema (idempotent)."""
    with database(opts, need_schema=False) as conn:
        applied = migrate.install(conn)
        version = migrate.code_version()
        names = [f"{m.version:04d}_{m.name}" for m in applied]
        human = (f"applied {len(applied)} migration(s): {', '.join(names)}; schema at version {version}"
                 if applied else f"schema already at version {version}; nothing to do")
        emit(opts, {"database": conn.info.dbname, "version": version, "applied": names}, human)
