"""CRON_TABLE documents from Python: apply, read, and the rows ``radixjobs jobs list`` shows beside jobs.

Writes go through ``radix.apply_documents`` — the function a SQL user calls — after the same checks in
Python (model.validate, plus the expression checker PostgreSQL does not have), so a bad input is refused
whole, with every problem named, before anything is sent. Reads go through ``radix.document_overview``,
which shows a role the documents whose owner's privileges it has (all to a superuser).

Who may use a CSP service is granted in the database by the operator (``grant_service`` /
``revoke_service``: the radix schema owner or a superuser); ``list_service_grants`` shows the operator every
grant and anyone else only the grants it benefits from.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any, LiteralString

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from radixjobs.catalog import LIST_COLUMNS
from radixjobs.db import first_line
from radixjobs.documents.model import DEFINITION_PROPS, DOCKIND, RESERVED_PROPS, DocumentError, validate
from radixjobs.errors import AdmissionError, RadixError

Conn = psycopg.Connection[Any]
Documents = Mapping[str, Any] | Sequence[Mapping[str, Any]]

_ORDER = ("ORDER BY (num ~ '^-?[0-9]+$') DESC, CASE WHEN num ~ '^-?[0-9]+$' THEN num::numeric END, "
          "num COLLATE \"C\"")


def apply(conn: Conn, docs: Documents) -> list[dict[str, Any]]:
    """Apply one document or a list, all or nothing; one result per document, in input order:
    ``{"num", "action": "created" | "updated" | "unchanged", "version", "ignored": [maintained props]}``.

    Raises DocumentError naming every problem (AdmissionError for other database errors); nothing is
    written then.
    """
    if isinstance(docs, Mapping):
        payload: Any = dict(docs)
    elif isinstance(docs, Sequence) and not isinstance(docs, str | bytes):
        payload = list(docs)
    else:  # a JSON scalar ("str", 42, null): not a document, and never split into characters
        raise DocumentError([f"expected one document (a JSON object) or a list of them, not {describe_json(docs)}"])
    problems = validate(payload)
    if problems:
        raise DocumentError(problems)
    try:
        with conn.transaction():
            row = conn.execute("SELECT radix.apply_documents(%s)", (Jsonb(payload),)).fetchone()
    except psycopg.Error as exc:
        raise _rejection(exc) from None
    return list(row[0]) if row else []


def describe_json(value: Any) -> str:
    """The JSON type of a value, in words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return "a string" if isinstance(value, str) else "a number" if isinstance(value, int | float) else "a value"


def _rejection(exc: psycopg.Error) -> RadixError:
    """The database's verdict: every problem for a rejected document, else PostgreSQL's own error."""
    diag = exc.diag
    primary = diag.message_primary or first_line(exc)
    if primary.startswith("CRON_TABLE document rejected") and diag.message_detail:
        return DocumentError(diag.message_detail.splitlines(), exc.sqlstate or "22023")
    return AdmissionError(primary, exc.sqlstate or "RX000")


def _iso(value: dt.datetime | None) -> str | None:
    return None if value is None else value.astimezone(dt.UTC).isoformat()


def to_document(row: Mapping[str, Any]) -> dict[str, Any]:
    """A row of radix.document_overview in the seed's shape, with the maintained properties filled in."""
    given = dict(row["props"])
    given["RUN_AS"] = row["principal"]
    props = {k: given[k] for k in DEFINITION_PROPS + RESERVED_PROPS if k in given}
    props.update({
        "SYS_PROCESS_ID": row["sys_process_id"],
        "COUNT_ERROR": row["count_error"],
        "LAST_RUN": _iso(row["last_run"]),
        "NEXT_RUN": _iso(row["next_run"]),
        "DAILY_START_TIME": _iso(row["daily_start_time"]),
        "DAILY_END_TIME": _iso(row["daily_end_time"]),
        "ERROR_TEXT": row["error_text"],
    })
    return {"dockind": row["dockind"] or DOCKIND, "status": row["status"], "props": props}


def overview_rows(conn: Conn) -> list[dict[str, Any]]:
    """The visible documents as rows of radix.document_overview, ordered by NUM."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute(f"SELECT * FROM radix.document_overview {_ORDER}").fetchall()


def list_documents(conn: Conn) -> list[dict[str, Any]]:
    """Every document the current role may see, in the seed's shape, ordered by NUM."""
    return [to_document(r) for r in overview_rows(conn)]


def get_document(conn: Conn, num: str | int) -> dict[str, Any] | None:
    """One document by NUM, in the seed's shape; None when absent (or not visible)."""
    with conn.cursor(row_factory=dict_row) as cur:
        row = cur.execute("SELECT * FROM radix.document_overview WHERE num = %s", (str(num),)).fetchone()
    return None if row is None else to_document(row)


def list_processes(conn: Conn, num: str | int, limit: int = 20) -> list[dict[str, Any]]:
    """The newest system processes of a task, newest first."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute("SELECT * FROM radix.document_processes WHERE num = %s ORDER BY id DESC LIMIT %s",
                           (str(num), limit)).fetchall()


def overview(conn: Conn) -> list[dict[str, Any]]:
    """Documents as rows with catalog.LIST_COLUMNS keys, to list beside DDL jobs."""
    return [overview_row(r) for r in overview_rows(conn)]


def overview_row(row: Mapping[str, Any]) -> dict[str, Any]:
    props = row["props"]
    procedure = props.get("DB_FUNCTION") or f"csp:{props.get('CSP_SERVICE')}"
    values = {
        "name": f"doc:{row['num']}",
        "schedule": props.get("INTERVAL") or "",
        "principal": row["principal"],
        "procedure": procedure,
        "enabled": row["status"] == "CRON_TABLE_ACTIVE",
        "definition_version": row["version"],
        "status": row["status"],
        "next_run_at": row["next_run_at"],
    }
    return {key: values.get(key) for key in LIST_COLUMNS}


def grant_service(conn: Conn, service: str, grantee: str) -> bool:
    """Let documents whose RUN_AS has the privileges of ``grantee`` (a role, or ``PUBLIC``) name ``service``;
    False when that grant existed. The operator's verb: others get permission denied."""
    return _service_verb(conn, "SELECT radix.grant_service(%s::pg_catalog.text, %s::pg_catalog.name)",
                         service, grantee)


def revoke_service(conn: Conn, service: str, grantee: str) -> bool:
    """Withdraw a grant; False when there was none. Tasks already applied fail at their next start."""
    return _service_verb(conn, "SELECT radix.revoke_service(%s::pg_catalog.text, %s::pg_catalog.name)",
                         service, grantee)


def _service_verb(conn: Conn, query: LiteralString, service: str, grantee: str) -> bool:
    try:
        with conn.transaction():
            row = conn.execute(query, (service, grantee)).fetchone()
    except psycopg.Error as exc:
        raise AdmissionError(exc.diag.message_primary or first_line(exc), exc.sqlstate or "RX000") from None
    return bool(row and row[0])


def list_service_grants(conn: Conn) -> list[dict[str, Any]]:
    """The CSP service grants this role may see (all for the operator), by service and grantee."""
    with conn.cursor(row_factory=dict_row) as cur:
        return cur.execute('SELECT service, grantee, granted_by, granted_at FROM radix.csp_services '
                           'ORDER BY service COLLATE "C", grantee COLLATE "C"').fetchall()
