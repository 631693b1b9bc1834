"""``radixjobs docs``: CRON_TABLE documents (DocScheduler tasks) — apply, list, show, run, and the
operator's CSP service grants (services, grant-service, revoke-service)."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from radixjobs import output
from radixjobs.cli.common import (
    Options,
    common_options,
    database,
    decode_utf8,
    emit,
    ensure_schema,
    input_name,
    max_per_principal_option,
)
from radixjobs.config import open_target
from radixjobs.db import connect
from radixjobs.documents import store
from radixjobs.documents.model import DocumentError
from radixjobs.errors import RadixError

LIST_COLUMNS = ("NUM", "status", "target", "INTERVAL", "RUN_AS", "COUNT_ERROR", "NEXT_RUN", "LAST_RUN",
                "ERROR_TEXT")


@click.group("docs")
def docs_group() -> None:
    """CRON_TABLE documents (DocScheduler tasks): apply, list, show, run."""


def _reject(opts: Options, exc: DocumentError) -> None:
    """Every problem on stderr (and as JSON with --json); exit code 1."""
    if opts.json:
        click.echo(output.to_json({"error": str(exc), "code": exc.code, "problems": exc.problems}))
    click.echo(f"radixjobs: error: {exc}", err=True)
    if len(exc.problems) > 1:
        for problem in exc.problems:
            click.echo(f"  - {problem}", err=True)
    sys.exit(1)  # (ctx.exit's code is dropped by cli.main's standalone_mode=False)


@docs_group.command("apply")
@click.argument("file", type=click.File("rb"))
@common_options
def docs_apply(opts: Options, file: Any) -> None:
    """Create or update the documents of FILE (one JSON document or a list; '-' for standard input).

    All or nothing: a bad document is refused with every problem named and nothing is written.
    Applying the same file again changes nothing.
    """
    try:
        docs = json.loads(decode_utf8(file.read(), input_name(file)))
    except json.JSONDecodeError as exc:
        raise RadixError(f"{input_name(file)} is not valid JSON: {exc}") from None
    if not isinstance(docs, dict | list):
        _reject(opts, DocumentError([f"{input_name(file)} holds {store.describe_json(docs)}: expected one document "
                                     "(a JSON object) or a list of them"]))
        return
    with database(opts) as conn:
        try:
            results = store.apply(conn, docs)
        except DocumentError as exc:
            _reject(opts, exc)
            return
    rows = [[r["num"], r["action"], r["version"], ", ".join(r["ignored"])] for r in results]
    emit(opts, results, output.render_table(["NUM", "action", "version", "ignored (maintained)"], rows))


def _list_row(doc: dict[str, Any]) -> list[Any]:
    props = doc["props"]
    target = props.get("DB_FUNCTION") or f"csp:{props.get('CSP_SERVICE')}"
    error = props.get("ERROR_TEXT") or ""
    return [props["NUM"], doc["status"], target, props.get("INTERVAL"), props.get("RUN_AS"),
            props.get("COUNT_ERROR"), props.get("NEXT_RUN"), props.get("LAST_RUN"),
            error if len(error) <= 60 else error[:59] + "…"]


@docs_group.command("list")
@common_options
def docs_list(opts: Options) -> None:
    """The documents this role may see, with their run state."""
    with database(opts) as conn:
        docs = store.list_documents(conn)
    emit(opts, docs, output.render_table(LIST_COLUMNS, [_list_row(d) for d in docs]))


@docs_group.command("show")
@click.argument("num")
@click.option("--processes", "limit", default=10, show_default=True, type=click.IntRange(0, 256),
              help="How many recent system processes to show (human output).")
@common_options
def docs_show(opts: Options, num: str, limit: int) -> None:
    """One document in full (--json: the document itself, maintained properties filled in)."""
    with database(opts) as conn:
        doc = store.get_document(conn, num)
        processes = store.list_processes(conn, num, limit) if doc is not None and limit else []
    if doc is None:
        raise RadixError(f"document NUM {num} does not exist (or is not visible to this role)")
    human = output.render_mapping({"dockind": doc["dockind"], "status": doc["status"], **doc["props"]})
    if processes:
        human += "\n\nsystem processes:\n" + output.render_records(
            processes, ["id", "type", "target", "status", "node", "started_at", "duration", "error_text"])
    emit(opts, doc, human)


@docs_group.command("services")
@common_options
def docs_services(opts: Options) -> None:
    """The CSP service grants: every one for the operator, only those this role benefits from otherwise."""
    with database(opts) as conn:
        grants = store.list_service_grants(conn)
    emit(opts, grants, output.render_table(["service", "grantee", "granted_by", "granted_at"],
                                           [[g["service"], g["grantee"], g["granted_by"], g["granted_at"]]
                                            for g in grants]))


@docs_group.command("grant-service")
@click.argument("service")
@click.argument("grantee")
@common_options
def docs_grant_service(opts: Options, service: str, grantee: str) -> None:
    """Let documents whose RUN_AS has the privileges of GRANTEE (a role, or PUBLIC) name SERVICE (operator)."""
    with database(opts) as conn:
        added = store.grant_service(conn, service, grantee)
    emit(opts, {"service": service, "grantee": grantee, "changed": added},
         f"granted CSP service {service!r} to {grantee}" if added
         else f"CSP service {service!r} was already granted to {grantee}")


@docs_group.command("revoke-service")
@click.argument("service")
@click.argument("grantee")
@common_options
def docs_revoke_service(opts: Options, service: str, grantee: str) -> None:
    """Withdraw a grant of SERVICE to GRANTEE (operator); its tasks fail at their next start."""
    with database(opts) as conn:
        removed = store.revoke_service(conn, service, grantee)
    emit(opts, {"service": service, "grantee": grantee, "changed": removed},
         f"revoked CSP service {service!r} from {grantee}" if removed
         else f"CSP service {service!r} was not granted to {grantee}")


@docs_group.command("run")
@click.option("--once", is_flag=True, help="Run what is due now (to the end), then exit.")
@click.option("--for", "seconds", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Serve for SECONDS (notifications, timers), then exit.")
@click.option("--service", "service_pairs", multiple=True, metavar="NAME=module:function",
              help="Register a CSP service (repeatable; entry points 'radixjobs.services' too). Who may use "
                   "it is granted in the database: radixjobs docs grant-service.")
@click.option("--node-id", default=None, help="This node's id (default host:pid).")
@click.option("--check-period", default=30.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Longest wait between checks, in seconds.")
@click.option("--reload-period", default=600.0, show_default=True, type=click.FloatRange(min=1),
              help="Period of the full reload, in seconds.")
@click.option("--service-timeout", default=300.0, show_default=True, type=click.FloatRange(min=0.1),
              help="Seconds a CSP service may run before its worker is killed.")
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Runs at the same time.")
@max_per_principal_option("half of --concurrency")
@common_options
def docs_run(opts: Options, once: bool, seconds: float | None, service_pairs: tuple[str, ...],
             node_id: str | None, check_period: float, reload_period: float, service_timeout: float,
             concurrency: int, max_per_principal: int | None) -> None:
    """Run the CRON_TABLE tasks of one database in the foreground (an engine that leaves the jobs to
    `run` and `serve`; `serve` runs both)."""
    import asyncio

    from radixjobs.documents.runner import COUNTER_KEYS, Documents
    from radixjobs.engine import Engine

    if once == (seconds is not None):
        raise click.UsageError("give exactly one of --once or --for SECONDS")
    from radixjobs.server.reload import parse_services

    allowed = parse_services(service_pairs)

    async def go(dsn: str) -> dict[str, Any]:
        documents = Documents(services=allowed, check_period_s=check_period, reload_period_s=reload_period,
                              service_timeout_s=service_timeout)
        async with Engine(dsn, node_id=node_id, concurrency=concurrency, max_per_principal=max_per_principal,
                          work=documents, jobs=False) as engine:
            before = engine.counters["doc_runs"]
            await (engine.run_due() if once else engine.run_for(seconds or 0.0))
            return {"runs": engine.counters["doc_runs"] - before, "node": engine.node_id,
                    "counters": {key: engine.counters[key] for key in COUNTER_KEYS},
                    "last_error": documents.last_error}

    with open_target(opts.dsn, opts.home) as target:
        with connect(target.dsn) as conn:  # the embedded server gets the schema; any other is checked
            ensure_schema(conn, target)
        result = asyncio.run(go(target.dsn))
    counters = ", ".join(f"{k}={v}" for k, v in sorted(result["counters"].items()))
    emit(opts, result, f"ran {result['runs']} task run(s) on node {result['node']}; counters: {counters}")
