"""The radix routines: every function, view, trigger and grant, from ``sql/routines/``, applied by the install.

Invariants:

- Each object is defined in exactly one file; the files are applied in ``ROUTINES`` order (views after the
  functions they call, ``grants.sql`` last: the allow-list of what PUBLIC may use).
- Applying is idempotent and leaves the database holding exactly the source: every statement is a
  ``CREATE OR REPLACE``; one whose object cannot be replaced in place (a function's result type or argument
  names changed, a view's columns) is dropped and created again; afterwards every function and view in schema
  radix, and every trigger on a radix table that runs a radix function, that the source does not define is
  dropped (never with CASCADE: an object of someone else's that depends on one stops the install, naming it).
  An operator's own trigger on a radix table (an audit copy of the history) runs a function of another schema
  and is kept.
- It all happens in the caller's transaction, with ``check_function_bodies`` off (a body may name a routine of
  a later file); a failure leaves nothing changed.
- ``checksum()`` is the sha256 of the source as applied; the install records it in ``radix.routine_source``
  with a fingerprint of the routines' catalog rows. Like Flyway's repeatable migrations, the source is applied
  again only when either changed (a new source, or a routine changed or added by hand), so an install of an
  up-to-date database writes nothing and waits on no lock an ordinary role can hold.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import psycopg
from pglast import ast, enums, parse_sql
from pglast.stream import RawStream
from psycopg import errors

from radixjobs.errors import SchemaError
from radixjobs.sqlscript import split_script

# Applied in this order.
ROUTINES = ("basics", "identity", "tokens", "admission", "groups", "dependencies", "jobs", "requests", "hooks",
            "nodes", "finder", "deadlines", "outcomes", "tick", "batch", "lease", "frames", "services", "documents",
            "views", "grants")
# The errors of a CREATE OR REPLACE that cannot replace its object in place.
_NOT_REPLACEABLE = (errors.InvalidFunctionDefinition, errors.InvalidTableDefinition)
_EXISTING = """
SELECT 'FUNCTION', p.oid::pg_catalog.regprocedure::pg_catalog.text FROM pg_catalog.pg_proc p
WHERE p.pronamespace OPERATOR(pg_catalog.=) 'radix'::pg_catalog.regnamespace
  AND p.oid OPERATOR(pg_catalog.<>) ALL (%(functions)s::pg_catalog.regprocedure[])
  AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d WHERE d.classid OPERATOR(pg_catalog.=)
                  'pg_catalog.pg_proc'::pg_catalog.regclass AND d.objid OPERATOR(pg_catalog.=) p.oid
                  AND d.deptype OPERATOR(pg_catalog.=) 'e')
UNION ALL
SELECT 'VIEW', c.oid::pg_catalog.regclass::pg_catalog.text FROM pg_catalog.pg_class c
WHERE c.relnamespace OPERATOR(pg_catalog.=) 'radix'::pg_catalog.regnamespace
  AND c.relkind OPERATOR(pg_catalog.=) ANY ('{v,m}'::pg_catalog.char[])
  AND c.oid OPERATOR(pg_catalog.<>) ALL (%(views)s::pg_catalog.regclass[])
UNION ALL
SELECT 'TRIGGER', pg_catalog.format('%%I ON %%s', t.tgname, t.tgrelid::pg_catalog.regclass)
FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
JOIN pg_catalog.pg_proc f ON f.oid OPERATOR(pg_catalog.=) t.tgfoid
WHERE c.relnamespace OPERATOR(pg_catalog.=) 'radix'::pg_catalog.regnamespace AND NOT t.tgisinternal
  AND f.pronamespace OPERATOR(pg_catalog.=) 'radix'::pg_catalog.regnamespace
  AND (t.tgname OPERATOR(pg_catalog.||) ' ON radix.' OPERATOR(pg_catalog.||) c.relname)
      OPERATOR(pg_catalog.<>) ALL (%(triggers)s::pg_catalog.text[])
"""


_RECORDED = "SELECT r.checksum, r.fingerprint FROM radix.routine_source r"
# What the routines are now: every radix function's and view's definition and grants, every trigger on a radix
# table. Read from the catalogs only (no lock on a radix table or view).
_FINGERPRINT = """
SELECT pg_catalog.md5(pg_catalog.string_agg(d, E'\\n' ORDER BY d)) FROM (
    SELECT pg_catalog.concat_ws(' ', p.oid::pg_catalog.regprocedure, pg_catalog.pg_get_functiondef(p.oid),
                                p.proacl) AS d
    FROM pg_catalog.pg_proc p
    WHERE p.pronamespace OPERATOR(pg_catalog.=) 'radix'::pg_catalog.regnamespace
      AND p.prokind OPERATOR(pg_catalog.<>) 'a'
    UNION ALL
    SELECT pg_catalog.concat_ws(' ', c.oid::pg_catalog.regclass, pg_catalog.pg_get_viewdef(c.oid), c.relacl)
    FROM pg_catalog.pg_class c
    WHERE c.relnamespace OPERATOR(pg_catalog.=) 'radix'::pg_catalog.regnamespace
      AND c.relkind OPERATOR(pg_catalog.=) 'v'
    UNION ALL
    SELECT pg_catalog.pg_get_triggerdef(t.oid)
    FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) t.tgrelid
    WHERE c.relnamespace OPERATOR(pg_catalog.=) 'radix'::pg_catalog.regnamespace AND NOT t.tgisinternal
) routines(d)
"""


@dataclass(frozen=True)
class Statement:
    """One statement of the source; ``kind`` and ``name`` say what it defines (the name as its DROP takes it)."""

    sql: str
    kind: str | None  # FUNCTION, VIEW, TRIGGER; None: anything else (a grant, a comment)
    name: str | None

    @property
    def drop_name(self) -> str:
        """The name as DROP takes it (a trigger's own name quoted)."""
        if self.kind == "TRIGGER" and self.name:
            trigger, table = self.name.split(" ON ", 1)
            return f'"{trigger}" ON {table}'
        return self.name or ""


@dataclass(frozen=True)
class Source:
    text: str
    statements: tuple[Statement, ...]

    def names(self, kind: str) -> list[str]:
        return [s.name for s in self.statements if s.kind == kind and s.name is not None]


def _read(name: str) -> str:
    return resources.files("radixjobs").joinpath("sql", "routines", f"{name}.sql").read_text(encoding="utf-8")


def _defines(sql: str) -> tuple[str | None, str | None]:
    """What a statement defines: its kind and the name its DROP takes."""
    node = parse_sql(sql)[0].stmt
    if isinstance(node, ast.CreateFunctionStmt):
        name = ".".join(part.sval for part in node.funcname or ())
        types = [RawStream()(p.argType) for p in node.parameters or ()
                 if p.mode not in (enums.FunctionParameterMode.FUNC_PARAM_OUT,
                                   enums.FunctionParameterMode.FUNC_PARAM_TABLE)]
        return "FUNCTION", f"{name}({', '.join(types)})"
    if isinstance(node, ast.ViewStmt) and node.view is not None:
        return "VIEW", f"{node.view.schemaname}.{node.view.relname}"
    if isinstance(node, ast.CreateTrigStmt) and node.relation is not None:
        return "TRIGGER", f"{node.trigname} ON {node.relation.schemaname}.{node.relation.relname}"
    return None, None


@cache
def source() -> Source:
    """The routine source, read and cut into statements once per process."""
    texts = [_read(name) for name in ROUTINES]
    statements = []
    for text in texts:
        for statement in split_script(text):
            kind, name = _defines(statement.text)
            statements.append(Statement(statement.text, kind, name))
    return Source("".join(texts), tuple(statements))


def checksum() -> str:
    """The sha256 of the routine source this code applies."""
    return hashlib.sha256(source().text.encode()).hexdigest()


def apply(conn: psycopg.Connection[Any]) -> bool:
    """Make the database's routines the source's, in the caller's transaction (search_path pinned by the
    caller); returns whether anything was applied.

    Nothing is done, and no lock taken, when the recorded checksum is the source's and the routines are as
    they were left (the fingerprint of their catalog rows is the one recorded): an ordinary role holding
    locks on radix's tables or views then holds up no install."""
    recorded = conn.execute(_RECORDED).fetchone()
    if recorded is not None and recorded[0] == checksum() and recorded[1] == _fingerprint(conn):
        return False
    src = source()
    conn.execute("SET LOCAL check_function_bodies = off")
    try:
        with conn.transaction():
            conn.execute(src.text)
    except _NOT_REPLACEABLE:
        for statement in src.statements:  # one at a time: drop what cannot be replaced in place
            _apply_one(conn, statement)
    _drop_strays(conn, src)
    conn.execute("INSERT INTO radix.routine_source (checksum, fingerprint) "
                 "VALUES (%s::pg_catalog.text, %s::pg_catalog.text) ON CONFLICT (only_row) DO UPDATE "
                 "SET checksum = excluded.checksum, fingerprint = excluded.fingerprint, "
                 "applied_at = pg_catalog.clock_timestamp()", (checksum(), _fingerprint(conn)))
    return True


def _fingerprint(conn: psycopg.Connection[Any]) -> str:
    row = conn.execute(_FINGERPRINT).fetchone()
    return str(row[0]) if row else ""


def _apply_one(conn: psycopg.Connection[Any], statement: Statement) -> None:
    try:
        with conn.transaction():
            conn.execute(statement.sql)
    except _NOT_REPLACEABLE:
        if statement.kind is None:
            raise
        _drop(conn, statement.kind, statement.drop_name)
        conn.execute(statement.sql)


def _drop_strays(conn: psycopg.Connection[Any], src: Source) -> None:
    """Drop the radix functions, views and triggers the source does not define (triggers first, then views)."""
    strays = conn.execute(_EXISTING, {"functions": src.names("FUNCTION"), "views": src.names("VIEW"),
                                      "triggers": src.names("TRIGGER")}).fetchall()
    order = {"TRIGGER": 0, "VIEW": 1, "FUNCTION": 2}
    for kind, name in sorted(strays, key=lambda row: order[row[0]]):
        _drop(conn, kind, name)


def _drop(conn: psycopg.Connection[Any], kind: str, name: str) -> None:
    try:
        with conn.transaction():
            conn.execute(f"DROP {kind} {name}")
    except errors.DependentObjectsStillExist as exc:
        raise SchemaError(f"cannot replace radix {kind.lower()} {name}: {exc.diag.message_detail or exc}"
                          .replace("\n", "; ")) from None
