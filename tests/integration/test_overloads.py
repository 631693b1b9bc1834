"""CREATE JOB picks the procedure overload exactly as CALL would, and stores checked, canonical arguments.

Every case is run twice: as job DDL, and as PostgreSQL's own ``CALL`` with the same argument text. Each
overload records which one ran, so an accepted job must name the overload CALL ran, and the engine's CALL
built from the stored binding (``build_call``, and ``build_tick_call`` as a tick batch runs it) must run it
too. A refusal must be PostgreSQL's own refusal (same SQLSTATE) and write nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from radixjobs import catalog
from radixjobs.engine.definitions import build_call, build_tick_call, dollar_quoted
from tests.integration.test_admission import (
    Counts,
    RoleFactory,
    Site,
    assert_refused,
    create_ddl,
    open_site,
    outcome,
)
from tests.support import PgCluster

Conn = psycopg.Connection[Any]
Binding = tuple[str | None, str, str | None, bool]  # (name, type, canonical value, passed by name)


@pytest.fixture
def site(pg: PgCluster, roles: RoleFactory, db: str) -> Iterator[Site]:
    yield from open_site(pg, roles, db)


def define(site: Site, routines: tuple[str, ...], kind: str = "PROCEDURE") -> dict[str, str]:
    """Create overloads of work.p, each recording its own tag when called; returns tag -> signature."""
    signatures = {}
    for number, params in enumerate(routines):
        tag = f"{kind.lower()}#{number}"
        body = f"BEGIN INSERT INTO work.calls (tag) VALUES ('{tag}'); END"
        returns = " RETURNS integer" if kind == "FUNCTION" else ""
        if kind == "FUNCTION":
            body = f"BEGIN INSERT INTO work.calls (tag) VALUES ('{tag}'); RETURN 1; END"
        site.su.execute(f"CREATE {kind} work.p({params}){returns} LANGUAGE plpgsql AS $${body}$$".encode())
        row = site.su.execute("SELECT oid::regprocedure::text FROM pg_proc WHERE pronamespace = 'work'::regnamespace "
                              "AND proname = 'p' AND position(%s IN prosrc) > 0", (f"'{tag}'",)).fetchone()
        assert row is not None
        signatures[tag] = row[0]
    return signatures


def last_call(site: Site, tags: dict[str, str]) -> str:
    """The signature of the overload that ran last (and forget it)."""
    row = site.su.execute("DELETE FROM work.calls WHERE id = (SELECT max(id) FROM work.calls) RETURNING tag").fetchone()
    assert row is not None, "no overload ran"
    return tags[row[0]]


def stored_binding(job: dict[str, Any]) -> tuple[Binding, ...]:
    return tuple((a["name"], a["type"], a["value"], a["by_name"]) for a in job["arguments"])


def run_stored_call(site: Site, conn: Conn, job: dict[str, Any], batch: bool = False) -> None:
    """The CALL the engine will make from the stored binding (exact types, values read by their input functions):
    the lone tick's DO block, or (``batch``) the CALL a tick batch runs by EXECUTE in PL/pgSQL (radix.run_ticks), the
    stored arguments given as a constant in place of the attempt's radix.current_arguments() or run_ticks' $1."""
    schema, name = site.su.execute("SELECT pronamespace::regnamespace::text, proname FROM pg_proc WHERE oid = %s",
                                   (job["procedure_oid"],)).fetchone() or ("", "")
    stored = dollar_quoted(json.dumps(job["arguments"]), "stored") + "::pg_catalog.jsonb"
    if not batch:
        conn.execute(build_call(schema, name, job["arguments"], stored))
        return
    call = dollar_quoted(build_tick_call(schema, name, job["arguments"]).decode(), "call")
    conn.execute(("DO " + dollar_quoted(f"BEGIN EXECUTE {call} USING {stored}; END", "block")).encode())


# ------------------------------------------------------------------------------------------ overload resolution


@dataclass(frozen=True)
class Case:
    procedures: tuple[str, ...]  # parameter lists of the overloads of work.p
    call: str  # the argument text, in CREATE JOB and in CALL
    picks: str | None = None  # the overload both pick, or
    code: str | None = None  # the SQLSTATE both raise
    bound: tuple[Binding, ...] | None = None  # the stored binding, when it matters
    functions: tuple[str, ...] = ()  # functions (not procedures) named work.p too


INT_OR_TEXT = ("a integer", "a text")
DEFAULTS = ("a integer, b text DEFAULT 'x', c integer DEFAULT 0",)
OUT_PARAM = ("a integer, OUT o text",)
CASES: dict[str, Case] = {
    "integer literal": Case(INT_OR_TEXT, "1", "work.p(integer)", bound=(("a", "integer", "1", False),)),
    "string literal": Case(INT_OR_TEXT, "'x'", "work.p(text)", bound=(("a", "text", "x", False),)),
    "cast string": Case(INT_OR_TEXT, "'1'::int", "work.p(integer)", bound=(("a", "integer", "1", False),)),
    "CAST()": Case(INT_OR_TEXT, "CAST('7' AS integer)", "work.p(integer)"),
    "NULL prefers the string category": Case(INT_OR_TEXT, "NULL", "work.p(text)", bound=(("a", "text", None, False),)),
    "typed date vs text": Case(("a date", "a text"), "'2026-01-01'::date", "work.p(date)"),
    "untyped date string vs text": Case(("a date", "a text"), "'2026-01-01'", "work.p(text)"),
    "named picks by name": Case(("a integer", "b text"), "b => 'x'", "work.p(text)"),
    "named and defaulted": Case(DEFAULTS, "1, c => 5", "work.p(integer,text,integer)",
                                bound=(("a", "integer", "1", False), ("c", "integer", "5", True),
                                       ("b", "text", "x", False))),  # b's default, frozen
    "all named, any order": Case(DEFAULTS, "c => 5, a => 2", "work.p(integer,text,integer)",
                                 bound=(("c", "integer", "5", True), ("a", "integer", "2", True),
                                        ("b", "text", "x", True))),
    "required parameter missing": Case(DEFAULTS, "c => 5", code="42883"),
    "unknown parameter name": Case(DEFAULTS, "1, z => 5", code="42883"),
    "OUT parameter needs an argument": Case(OUT_PARAM, "1", code="42883"),
    "OUT parameter given NULL": Case(OUT_PARAM, "1, NULL", "work.p(integer)",
                                     bound=(("a", "integer", "1", False), ("o", "text", None, False))),
    "INOUT parameter": Case(("INOUT a integer",), "1", "work.p(integer)", bound=(("a", "integer", "1", False),)),
    "ambiguous through a default": Case(("a integer", "a integer, b integer DEFAULT 0"), "1", code="42725"),
    "default overload chosen by arity": Case(("a integer", "a integer, b integer DEFAULT 0"), "1, 2",
                                             "work.p(integer,integer)"),
    "ambiguous numeric widening": Case(("a bigint", "a numeric"), "1", code="42725"),
    "cast settles the ambiguity": Case(("a bigint", "a numeric"), "1::bigint", "work.p(bigint)"),
    "ambiguous with an OUT parameter": Case(("a integer, OUT o text", "a integer, b text"), "1, NULL",
                                            code="42725"),
    "integer array": Case(("a integer[]", "a bigint[]"), "ARRAY[1, 2]", "work.p(integer[])",
                          bound=(("a", "integer[]", "{1,2}", False),)),
    "typed array picks its type": Case(("a integer[]", "a bigint[]"), "ARRAY[1, 2]::bigint[]", "work.p(bigint[])",
                                       bound=(("a", "bigint[]", "{1,2}", False),)),
    "variadic": Case(("VARIADIC a integer[]",), "1, 2, 3", "work.p(integer[])"),
    "'abc' for an integer": Case(("a integer",), "'abc'", code="22P02"),
    "3000000000 for int4": Case(("a integer",), "3000000000", code="42883"),
    "1.5 for an integer": Case(("a integer",), "1.5", code="42883"),
    "impossible date": Case(("a date",), "'2026-02-30'::date", code="22008"),
    "a function, not a procedure": Case((), "1", code="42809", functions=("a integer",)),
    "a function beats the procedure": Case(("a text",), "1", code="42809", functions=("a integer",)),
    "the procedure beats a function": Case(("a text",), "'x'", "work.p(text)", functions=("a integer",)),
    "ambiguous with a function": Case(("a numeric",), "1", code="42725", functions=("a bigint",)),
}


@pytest.mark.parametrize("case", list(CASES), ids=str)
def test_overload_resolution_matches_call(site: Site, case: str) -> None:
    spec = CASES[case]
    principal = site.role("runner")
    tags = define(site, spec.procedures) | define(site, spec.functions, "FUNCTION")
    by_postgres = outcome(lambda: site.su.execute(f"CALL work.p({spec.call})".encode()))
    job_ddl = create_ddl(principal, call=f"work.p({spec.call})")
    if spec.picks is None:
        assert by_postgres.code == spec.code, by_postgres
        refusal = assert_refused(site, lambda: catalog.execute_job_ddl(site.su, job_ddl), str(spec.code))
        assert site.counts() == Counts(0, 0, 0)
        if spec.code == "42809":
            assert "Hint:" in refusal.message
        return

    assert by_postgres.code is None, by_postgres
    assert last_call(site, tags) == spec.picks
    assert catalog.execute_job_ddl(site.su, job_ddl) == "CREATE JOB"
    job = site.existing_job()
    assert job["procedure_signature"] == spec.picks
    regprocedure = site.su.execute("SELECT to_regprocedure(%s)::oid, to_regprocedure(%s)::text",
                                   (spec.picks, spec.picks)).fetchone()
    assert regprocedure == (job["procedure_oid"], job["procedure_signature"])
    if spec.bound is not None:
        assert stored_binding(job) == spec.bound
    run_stored_call(site, site.su, job)
    assert last_call(site, tags) == spec.picks
    run_stored_call(site, site.su, job, batch=True)
    assert last_call(site, tags) == spec.picks


# ------------------------------------------------------------------------------------------ stored values


@dataclass(frozen=True)
class Value:
    parameter: str  # the declared type of work.v's one parameter
    argument: str  # as written in the job DDL
    value: str | None  # the canonical text stored (and what the procedure receives, as ::text)


VALUES: dict[str, Value] = {
    "date literal": Value("date", "'2026-01-01'::date", "2026-01-01"),
    "string for a date": Value("date", "'2026-02-01'", "2026-02-01"),
    "interval": Value("interval", "INTERVAL '90 minutes'", "01:30:00"),
    "mixed-sign interval": Value("interval", "INTERVAL '-1 day +2 hours'", "-1 days +02:00:00"),
    "integer array": Value("integer[]", "ARRAY[1,2]", "{1,2}"),
    "nested array": Value("integer[]", "ARRAY[[1,2],[3,4]]", "{{1,2},{3,4}}"),
    "empty typed array": Value("integer[]", "ARRAY[]::integer[]", "{}"),
    "text array": Value("text[]", "ARRAY['a b', NULL]", '{"a b",NULL}'),
    "negative integer": Value("integer", "-5", "-5"),
    "numeric keeps its scale": Value("numeric", "1.50", "1.50"),
    "float keeps its precision": Value("double precision", "0.30000000000000004", "0.30000000000000004"),
    "boolean": Value("boolean", "true", "t"),  # the output function's text (a cast to text says "true")
    "NULL": Value("text", "NULL", None),
    "quoted string": Value("text", "'it''s; DROP TABLE work.calls; --'", "it's; DROP TABLE work.calls; --"),
    "escape string": Value("text", "E'tab\\there'", "tab\there"),
    "jsonb is normalised": Value("jsonb", "'{\"b\": 1, \"a\": [true]}'", '{"a": [true], "b": 1}'),
    "bigint from a cast": Value("bigint", "CAST(9000000000 AS bigint)", "9000000000"),
    "time stamp with an offset": Value("timestamp with time zone", "'2026-01-01 12:00:00+02'::timestamptz",
                                       "2026-01-01 10:00:00+00"),
}

# the creator's session prints dates, intervals, floats and time stamps its own way; the catalog must not
ODD_SESSION = ("SET DateStyle = 'SQL, DMY'", "SET IntervalStyle = 'sql_standard'", "SET extra_float_digits = 0",
               "SET TimeZone = 'Asia/Tokyo'")
# the procedure prints what it received in one fixed way, whatever the principal's session settings are
RECORDER = ("CREATE PROCEDURE work.v(a {type}) LANGUAGE plpgsql "
            "SET DateStyle = 'ISO, MDY' SET IntervalStyle = 'postgres' SET extra_float_digits = 1 SET TimeZone = 'UTC' "
            "AS $$ BEGIN INSERT INTO work.calls (tag) "
            "VALUES (CASE WHEN a IS NULL THEN '<null>' ELSE format('%s', a) END); END $$")


@pytest.mark.parametrize("session", ["default settings", "odd settings"])
@pytest.mark.parametrize("case", list(VALUES), ids=str)
def test_arguments_are_stored_canonically(site: Site, case: str, session: str) -> None:
    """The stored text is the same whatever the creator's session prints with, and reaches the procedure intact."""
    spec = VALUES[case]
    principal = site.role("runner")
    site.su.execute(RECORDER.format(type=spec.parameter).encode())
    site.run("GRANT USAGE ON SCHEMA work TO {}", principal)
    creator = site.connect(site.su.info.user)
    if session == "odd settings":
        for statement in ODD_SESSION:
            creator.execute(statement.encode())
    catalog.execute_job_ddl(creator, create_ddl(principal, call=f"work.v({spec.argument})"))
    job = site.existing_job()
    (stored,) = job["arguments"]
    assert (stored["type"], stored["value"]) == (spec.parameter, spec.value)
    run_stored_call(site, site.connect(principal), job)
    run_stored_call(site, site.connect(principal), job, batch=True)
    assert site.su.execute("SELECT tag FROM work.calls").fetchall() == [(spec.value or "<null>",)] * 2
