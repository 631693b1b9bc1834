"""Memory bounds against hostile tenants (issue #11, items 7 and 12): what a tenant stores or returns must
not make the daemon hold it.

- A job's arguments are at most radix.max_argument_bytes() of canonical text, refused at admission (DDL,
  the SQL API, and the definer side a caller could call directly) with one line naming both sizes.
- A document's props are bounded the same way at apply.
- The engine's definition cache is bounded by bytes as well as by count.
- A procedure's OUT/INOUT result, and a DB_FUNCTION's result, stay on the server: an engine (or document
  scheduler) in a subprocess runs a 64 MiB result with the peak RSS of a tiny one.
- Canonical argument text comes from the type's output function, not from a cast to text its owner wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from psycopg.types.json import Jsonb

from radixjobs import catalog, documents
from radixjobs.engine import definitions
from radixjobs.engine.definitions import DEFINITION_OVERHEAD_BYTES, DefinitionCache, JobDefinition, dollar_quoted
from radixjobs.errors import AdmissionError
from radixjobs.model import EverySchedule
from tests.apps import App

LIMIT = 65536
BIG = 64 * 1024 * 1024  # a result the daemon must never hold
RSS_SLACK_KB = 16 * 1024  # peak RSS may differ this much between a tiny and a BIG result (not by 64 MiB+)

EVERY_HOUR = "SCHEDULE EVERY INTERVAL '1 hour'"
ONCE = "SCHEDULE AT TIMESTAMP '2020-01-01T00:00:00Z'"


def _counts(app: App) -> tuple[Any, ...]:
    row = app.conn.execute("SELECT (SELECT count(*) FROM radix.jobs), "
                           "(SELECT count(*) FROM radix.radix_system_job_state), "
                           "(SELECT count(*) FROM radix.cron_table)").fetchone()
    assert row is not None
    return tuple(row)


def _tenant(app: App, roles: Any) -> psycopg.Connection[Any]:
    """A LOGIN role that may create jobs in schema app and schedule them as itself."""
    role = roles("tenant")
    app.conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA app TO {}").format(sql.Identifier(role)))
    dsn = make_conninfo(app.dsn, user=role)
    return psycopg.connect(dsn, autocommit=True)


# ------------------------------------------------------------------------------------------ argument size


def test_the_limit_is_a_constant_of_the_schema(app: App) -> None:
    assert app.conn.execute("SELECT radix.max_argument_bytes(), radix.max_document_bytes()").fetchone() == (
        LIMIT, LIMIT)


def test_oversize_argument_is_refused_by_ddl(app: App) -> None:
    with pytest.raises(AdmissionError) as refused:
        app.job(f"CREATE JOB app.big {EVERY_HOUR} RUN AS {{p}} CALL app.record('{'x' * (LIMIT + 1)}')")
    assert refused.value.code == "54000"
    assert str(refused.value).startswith(f"job arguments are {LIMIT + 1} bytes; the limit is {LIMIT}")
    assert "\n" not in str(refused.value)
    assert _counts(app) == (0, 0, 0)
    # exactly the limit is accepted
    app.job(f"CREATE JOB app.fits {EVERY_HOUR} RUN AS {{p}} CALL app.record('{'x' * LIMIT}')")
    assert _counts(app) == (1, 1, 0)


def test_the_canonical_text_is_what_counts(app: App) -> None:
    """A 9-character constant whose canonical text is 100,001 digits is refused as 100,001 bytes."""
    app.conn.execute("CREATE PROCEDURE app.n(a numeric) LANGUAGE sql AS $$ SELECT 1 $$")
    with pytest.raises(AdmissionError) as refused:
        app.job(f"CREATE JOB app.big {EVERY_HOUR} RUN AS {{p}} CALL app.n(1e100000)")
    assert refused.value.code == "54000"
    assert str(refused.value).startswith(f"job arguments are 100001 bytes; the limit is {LIMIT}")
    assert _counts(app) == (0, 0, 0)


def test_oversize_argument_is_refused_by_the_sql_api(app: App, roles: Any) -> None:
    """The red team's 40 MB argument, through radix.create_job as an ordinary role."""
    with _tenant(app, roles) as tenant, pytest.raises(psycopg.errors.ProgramLimitExceeded) as refused:
        tenant.execute("SELECT radix.create_job('app.big', '{\"every\": \"1 hour\"}', current_user, 'app.record', "
                       "jsonb_build_object('tag', repeat('x', 41943040)))")
    assert refused.value.diag.message_primary == f"job arguments are 41943040 bytes; the limit is {LIMIT}"
    assert _counts(app) == (0, 0, 0)


def test_the_definer_side_checks_the_size_too(app: App, roles: Any) -> None:
    """A caller that skips radix.create_job and forges a binding for radix._create_job is refused alike."""
    oid = app.conn.execute("SELECT 'app.record(text)'::regprocedure::oid").fetchone()
    assert oid is not None
    binding = {"procedure_oid": oid[0], "arguments": [
        {"position": 1, "type_oid": 25, "value": "x" * (LIMIT + 1), "by_name": False}]}
    with _tenant(app, roles) as tenant, pytest.raises(psycopg.errors.ProgramLimitExceeded) as refused:
        tenant.execute("SELECT radix._create_job(current_user, 'app.forged', '{\"every\": \"1 hour\"}', "
                       "current_user::text, 'app.record', %s, true, false, '{}')", (Jsonb(binding),))
    assert refused.value.diag.message_primary == f"job arguments are {LIMIT + 1} bytes; the limit is {LIMIT}"
    assert _counts(app) == (0, 0, 0)


def test_oversize_document_props_are_refused(app: App) -> None:
    doc = {"dockind": "CRON_TABLE", "status": "CRON_TABLE_PASSIVE",
           "props": {"NUM": 1, "DB_FUNCTION": "app.f", "RUN_AS": app.principal, "DESCR": "x" * LIMIT}}
    small = {"dockind": "CRON_TABLE", "status": "CRON_TABLE_PASSIVE",
             "props": {"NUM": 2, "DB_FUNCTION": "app.f", "RUN_AS": app.principal}}
    with pytest.raises(psycopg.errors.ProgramLimitExceeded) as refused:
        app.conn.execute("SELECT radix.apply_documents(%s)", (Jsonb([small, doc]),))
    assert refused.value.diag.message_primary.startswith("document 1: props are ")
    assert refused.value.diag.message_primary.endswith(f" bytes; the limit is {LIMIT}")
    with pytest.raises(AdmissionError) as through_the_api:
        documents.apply(app.conn, [small, doc])
    assert through_the_api.value.code == "54000"
    assert _counts(app) == (0, 0, 0)  # all or nothing: the small one is not written either
    documents.apply(app.conn, small)
    with pytest.raises(AdmissionError):  # an update is bounded too
        documents.apply(app.conn, {**small, "props": {**small["props"], "DESCR": "x" * LIMIT}})
    assert _counts(app) == (0, 0, 1)


# ------------------------------------------------------------------------------------------ definition cache


def _definition(call_bytes: int, version: int = 1, job_id: uuid.UUID | None = None) -> JobDefinition:
    return JobDefinition(job_id=job_id or uuid.uuid4(), definition_version=version, name="", principal="",
                         signature="", call=b"x" * call_bytes, deadline_ms=1000, non_atomic=False,
                         schedule=EverySchedule(10**9, None))


def test_the_definition_cache_is_bounded_by_bytes() -> None:
    entry = 10_000
    cache = DefinitionCache(1000, max_bytes=3 * (entry + DEFINITION_OVERHEAD_BYTES))
    first, second, third, fourth = (_definition(entry) for _ in range(4))
    for job in (first, second, third):
        cache.put(job)
    assert len(cache) == 3
    assert cache.get((first.job_id, 1)) is first  # now the most recently used
    cache.put(fourth)  # over the byte bound: the least recently used (second) goes
    assert (second.job_id, 1) not in cache
    assert all((j.job_id, 1) in cache for j in (first, third, fourth))
    assert cache.total_bytes == 3 * (entry + DEFINITION_OVERHEAD_BYTES) <= cache.max_bytes
    cache.put(_definition(cache.max_bytes))  # larger than the whole bound: not kept, pushes nothing out
    assert len(cache) == 3
    assert cache.total_bytes == 3 * (entry + DEFINITION_OVERHEAD_BYTES)
    cache.put(first)  # the same entry again is counted once
    assert cache.total_bytes == 3 * (entry + DEFINITION_OVERHEAD_BYTES)
    cache.put(_definition(entry))  # first was refreshed: third is now the least recently used
    assert (third.job_id, 1) not in cache
    assert (first.job_id, 1) in cache


def test_the_definition_cache_is_bounded_by_count() -> None:
    cache = DefinitionCache(2, max_bytes=10**9)
    jobs = [_definition(10) for _ in range(3)]
    for job in jobs:
        cache.put(job)
    assert len(cache) == 2
    assert (jobs[0].job_id, 1) not in cache
    assert cache.total_bytes == sum(j.size_bytes for j in jobs[1:])


# ------------------------------------------------------------------------------------------ results stay on the server

PEAK_RSS = """
import asyncio, resource, sys
from radixjobs.documents import Documents
from radixjobs.engine import Engine

async def main(kind: str, dsn: str) -> int:
    if kind == "engine":
        async with Engine(dsn) as engine:
            await engine.run_due()
            return engine.counters["successes"]
    async with Engine(dsn, work=Documents(), jobs=False) as engine:
        await engine.run_due()
        return engine.counters["doc_runs"]

done = asyncio.run(main(sys.argv[1], sys.argv[2]))
print(done, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""

RESULTS_SQL = """
CREATE PROCEDURE app.result(INOUT v text, n integer) LANGUAGE plpgsql AS $$
BEGIN
    v := repeat('x', n);
    CALL app.record('result ' || n);
END $$;
CREATE PROCEDURE app.result_committing(INOUT v text, n integer) LANGUAGE plpgsql AS $$
BEGIN
    CALL app.record('committed ' || n);
    COMMIT;  -- not atomic: the attempt is run again as a top-level CALL
    v := repeat('x', n);
END $$;
CREATE PROCEDURE app.out_result(n integer, OUT v text) LANGUAGE plpgsql AS $$
BEGIN
    v := repeat('x', n);
    CALL app.record('out ' || n);
END $$;
CREATE FUNCTION app.doc_result_small() RETURNS text LANGUAGE sql AS $$ SELECT 'x' $$;
CREATE FUNCTION app.doc_result_big() RETURNS text LANGUAGE sql AS $$ SELECT repeat('x', {big}) $$;
CREATE FUNCTION app.doc_rows() RETURNS SETOF text LANGUAGE sql AS $$ SELECT repeat('x', 1024 * 1024)
    FROM generate_series(1, 64) $$;
"""


def _peak_rss_kb(kind: str, dsn: str) -> tuple[int, int]:
    """(work done, peak RSS in KiB) of a fresh engine or document scheduler run once in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "RADIXJOBS_DSN"}
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, kind, dsn], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    work, rss = done.stdout.split()
    return int(work), int(rss)


@pytest.fixture
def results(app: App) -> App:
    app.conn.execute(RESULTS_SQL.format(big=BIG).encode())
    return app


@pytest.mark.parametrize("procedure", ["result", "result_committing", "out_result"])
def test_an_output_parameter_never_reaches_the_engine(results: App, procedure: str) -> None:
    arguments = {"result": "NULL, {n}", "result_committing": "NULL, {n}", "out_result": "{n}, NULL"}[procedure]
    peaks = []
    for size in (1, BIG):
        name = results.job(f"CREATE JOB app.r{size} {ONCE} RUN AS {{p}} "
                           f"CALL app.{procedure}({arguments.format(n=size)})")
        done, peak = _peak_rss_kb("engine", results.dsn)
        assert done == 1, results.state(name)["last_error"]
        assert results.state(name)["status"] == "complete"
        assert results.state(name)["non_atomic"] is (procedure == "result_committing")
        peaks.append(peak)
    assert [e[1].split()[1] for e in results.effects()] == ["1", str(BIG)]
    assert peaks[1] - peaks[0] < RSS_SLACK_KB, f"peak RSS {peaks[0]} KiB with a tiny result, {peaks[1]} with 64 MiB"


def test_a_db_function_result_never_reaches_the_scheduler(results: App) -> None:
    peaks = []
    for num, function in enumerate(("doc_result_small", "doc_result_big", "doc_rows"), 10):
        documents.apply(results.conn, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
            "NUM": num, "DB_FUNCTION": f"app.{function}", "RUN_AS": results.principal}})
        done, peak = _peak_rss_kb("documents", results.dsn)
        assert done == 1
        peaks.append(peak)
    statuses = results.conn.execute("SELECT task_num, status, error_text FROM radix.sys_processes ORDER BY id")
    assert statuses.fetchall() == [(str(n), "completed", None) for n in (10, 11, 12)]
    assert max(peaks) - peaks[0] < RSS_SLACK_KB, f"peak RSS (KiB) small, 64 MiB value, 64 MiB of rows: {peaks}"


def test_an_inout_parameter_left_to_its_default_gets_the_frozen_default(app: App) -> None:
    """PL/pgSQL (which keeps the result on the server) cannot CALL with an omitted INOUT argument; since
    defaults are frozen at CREATE JOB, the omitted one is stored with its default's value."""
    app.conn.execute("CREATE PROCEDURE app.d(INOUT x text DEFAULT 'a') LANGUAGE sql AS $$ SELECT 'b' $$")
    app.job(f"CREATE JOB app.d {EVERY_HOUR} RUN AS {{p}} CALL app.d()")
    assert [(a["name"], a["value"]) for a in app.state("app.d")["arguments"]] == [("x", "a")]
    assert _counts(app) == (1, 1, 0)


def test_a_principal_without_plpgsql_is_refused(app: App) -> None:
    app.conn.execute("REVOKE USAGE ON LANGUAGE plpgsql FROM PUBLIC")
    with pytest.raises(AdmissionError) as refused:
        app.job(f"CREATE JOB app.j {EVERY_HOUR} RUN AS {{p}} CALL app.record('x')")
    assert refused.value.code == "42501"
    assert "cannot use PL/pgSQL" in str(refused.value)
    assert _counts(app) == (0, 0, 0)


def test_a_dollar_quote_tag_never_occurs_in_its_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """A text that would complete the tag early (it ends with the tag's start) gets another tag."""
    tokens = iter(["aaaa", "bbbb"])
    monkeypatch.setattr(definitions.secrets, "token_hex", lambda _n: next(tokens))
    assert dollar_quoted("x$v_aaaa", "v") == "$v_bbbb$x$v_aaaa$v_bbbb$"


def test_hostile_argument_text_reaches_the_procedure_intact(app: App) -> None:
    """Quotes, backslashes and dollar quotes in a value, with the principal's own quoting settings."""
    value = "it's \\' $$ $radix_value_ $radix_do_x$ %s %(x)s"
    app.conn.execute(sql.SQL("ALTER ROLE {} SET standard_conforming_strings = off").format(
        sql.Identifier(app.principal)))
    app.conn.execute(sql.SQL("ALTER ROLE {} SET backslash_quote = on").format(sql.Identifier(app.principal)))
    app.conn.execute("SELECT radix.create_job('app.hostile', '{\"at\": \"2020-01-01\"}', %s, 'app.record', %s)",
                     (app.principal, Jsonb([{"kind": "string", "value": value}])))
    assert app.run().counters["successes"] == 1
    assert [e[1] for e in app.effects()] == [value]


# ------------------------------------------------------------------------------------------ canonical text (item 12)

CASTS_SQL = """
CREATE TYPE app.mood AS ENUM ('happy', 'sad');
CREATE TYPE app.pair AS (n integer, m app.mood);
CREATE FUNCTION app.mood_text(app.mood) RETURNS text LANGUAGE sql AS $$ SELECT 'not a mood' $$;
CREATE FUNCTION app.pair_text(app.pair) RETURNS text LANGUAGE sql AS $$ SELECT 'not a pair' $$;
CREATE CAST (app.mood AS text) WITH FUNCTION app.mood_text(app.mood);
CREATE CAST (app.pair AS text) WITH FUNCTION app.pair_text(app.pair);
CREATE PROCEDURE app.feel(m app.mood, p app.pair, ms app.mood[]) LANGUAGE plpgsql AS $$
BEGIN
    CALL app.record(format('%s %s %s', m, p, ms));
END $$;
"""


def test_a_cast_to_text_does_not_make_the_stored_argument(app: App) -> None:
    app.conn.execute(CASTS_SQL.encode())
    assert app.conn.execute("SELECT 'happy'::app.mood::text").fetchone() == ("not a mood",)
    name = app.job(f"CREATE JOB app.feel {ONCE} RUN AS {{p}} "
                   "CALL app.feel('happy', '(1,sad)'::app.pair, ARRAY['sad', 'happy']::app.mood[])")
    stored = [a["value"] for a in app.state(name)["arguments"]]
    assert stored == ["happy", "(1,sad)", "{sad,happy}"]
    assert app.run().counters["successes"] == 1
    assert [e[1] for e in app.effects()] == ["happy (1,sad) {sad,happy}"]


def test_catalog_job_show_is_unchanged_for_ordinary_values(app: App) -> None:
    """Built-in types print as before, except boolean, whose output function says t (its cast: true)."""
    app.conn.execute("CREATE PROCEDURE app.v(a integer, b date, c boolean, d text[]) LANGUAGE sql AS $$ SELECT 1 $$")
    name = app.job(f"CREATE JOB app.v {EVERY_HOUR} RUN AS {{p}} "
                   "CALL app.v(1, '2026-01-02', true, ARRAY['a b', NULL])")
    job = catalog.get_job(app.conn, name)
    assert job is not None
    assert [a["value"] for a in job["arguments"]] == ["1", "2026-01-02", "t", '{"a b",NULL}']
