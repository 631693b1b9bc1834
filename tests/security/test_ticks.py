"""The one-transaction tick (sql/routines/tick.sql, engine/ticks.py) is one simple query whose text
the procedure and the principal's other sessions can read: it carries the MAC of the tick's token for the
backend that runs it, never the token. Each attack reads the MAC through a real path (pg_stat_activity
from another session of the principal, current_query() inside the procedure) and tries to use it: from
another session, inside the tick's own transaction, and on the same backend after the tick failed. The
finder and the tick claim are the scheduler's alone."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from tests.apps import App, Background, holding, waiting_on
from tests.support import wait_for

LOCK = 86421  # the procedures wait on this advisory lock, held by the test, so their tick stays open
TICK = re.compile(r"radix\.run_tick\('([0-9a-f-]+)'::pg_catalog\.uuid, '([0-9]+)'::pg_catalog\.int8, "
                  r"'([0-9]+)'::pg_catalog\.int4, '([0-9a-f]+)'::pg_catalog\.text")
NODE = "41"  # end_tick's node argument (hex of the node id): any will do for an attack


def _procedure(app: App, name: str, body: str) -> None:
    app.conn.execute(f"CREATE PROCEDURE {name}() LANGUAGE plpgsql AS $$ BEGIN {body} END $$".encode())


def _as_principal(app: App) -> psycopg.Connection[Any]:
    return psycopg.connect(app.dsn, user=app.principal, autocommit=True)


@pytest.fixture
def held(app: App) -> Iterator[psycopg.Connection[Any]]:
    """The advisory lock the procedures wait on, held by a superuser session until released."""
    with holding(app, LOCK) as conn:
        yield conn


def _waiting_tick(app: App) -> tuple[int, str, str, int, int, str]:
    """The tick waiting on LOCK as the principal's own session sees it in pg_stat_activity: its pid, its
    query text, and the job, planned time, attempt and MAC read from that text."""
    pid, query = waiting_on(app, LOCK)
    found = TICK.search(query)
    assert found is not None, query
    job, planned, attempt, mac = found.groups()
    return pid, query, job, int(planned), int(attempt), mac


def _start_refused(conn: psycopg.Connection[Any], job: str, planned: int, mac: str) -> str | None:
    """radix.start_tick's refusal (its SQLSTATE) of the tick on ``conn``, None when it started it."""
    row = conn.execute("SELECT error_sqlstate FROM radix.start_tick(%s, %s, %s)", (job, planned, mac)).fetchone()
    assert row is not None
    return row[0] if isinstance(row[0], str) else None


def test_the_tick_query_carries_a_mac_that_no_other_session_can_use(app: App,
                                                                     held: psycopg.Connection[Any]) -> None:
    _procedure(app, "app.waits", f"PERFORM pg_advisory_xact_lock({LOCK}); CALL app.record('ran');")
    name = app.job("CREATE JOB app.mac SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.waits()")
    with Background(app.dsn, concurrency=1):
        _, query, job, planned, attempt, mac = _waiting_tick(app)
        row = app.conn.execute("SELECT radix._tick_token(job_id, %s, attempt, updated_at) "
                               "FROM radix.radix_system_job_state WHERE job_id = %s", (planned, job)).fetchone()
        assert row is not None
        token = row[0]
        assert str(token) not in query
        assert token.hex not in query
        with _as_principal(app) as other:
            # the tick's lock is held by the tick itself
            assert _start_refused(other, job, planned, mac) == "RXT01"
            with pytest.raises(psycopg.Error) as refused:  # the MAC is good only on the tick's backend
                other.execute("SELECT radix.end_tick(%s, %s, %s, %s, NULL, %s)", (job, planned, attempt, mac, NODE))
            assert refused.value.sqlstate == "RXL01"
        held.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
        wait_for(lambda: app.history(name) and app.history(name)[-1]["status"] == "succeeded")
    assert [e[1] for e in app.effects()] == ["ran"]
    assert [h["status"] for h in app.history(name)] == ["succeeded"]


def test_ending_its_own_tick_early_with_the_mac_rolls_everything_back(app: App) -> None:
    """The procedure reads its MAC from current_query() and ends its tick itself (the next tick far in the
    future): run_tick's own end_tick then finds the tick neither as begun nor published, and the whole tick
    rolls back, the forged end with it."""
    _procedure(app, "app.forge",
               "PERFORM radix.end_tick(radix.current_job_id(), substring(current_query() "
               "FROM 'run_tick\\(''[^'']+''::pg_catalog.uuid, ''([0-9]+)''')::bigint, radix.current_job_attempt(), "
               "substring(current_query() FROM '''([0-9a-f]{64})''::pg_catalog.text'), "
               "4102444800000000000, '41'); CALL app.record('forged');")
    name = app.job("CREATE JOB app.forger SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.forge() "
                   "WITH (max_attempts = 1)")
    planned = app.state(name)["planned_ns"]
    app.make_due(name)
    app.run(max_per_principal=1)
    (h,) = app.history(name)
    assert h["status"] == "failed", h
    assert "no longer as it began" in str(h["error"]), h
    assert app.effects() == []
    # the failure is recorded by the daemon, and the job stays on its grid, not in the year 2100
    assert app.state(name)["planned_ns"] in (planned, planned + 3600 * 10**9)


def test_a_tick_mac_replayed_after_the_tick_failed_is_refused(app: App, held: psycopg.Connection[Any]) -> None:
    """Tick A is read from pg_stat_activity while it runs, then fails. From another session of the
    principal, and from job B's tick on the same backend (one slot), A's MAC is replayed: by then A's
    failure is recorded and its token gone, so the replay can neither start nor end A's tick."""
    _procedure(app, "app.victim_body", f"PERFORM pg_advisory_xact_lock({LOCK}); RAISE EXCEPTION 'fails';")
    a = app.job("CREATE JOB app.a SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.victim_body() "
                "WITH (max_attempts = 1)")
    with Background(app.dsn, concurrency=1):
        pid, _, job, planned, attempt, mac = _waiting_tick(app)
        _procedure(app, "app.replay",
                   "DECLARE refused text; BEGIN SELECT s.error_message INTO refused "
                   f"FROM radix.start_tick('{job}', {planned}, '{mac}') s; "
                   "IF refused IS NOT NULL THEN RAISE EXCEPTION '%', refused; END IF; "
                   f"PERFORM radix.end_tick('{job}', {planned}, {attempt}, '{mac}', NULL, '41'); "
                   "CALL app.record('replayed'); EXCEPTION WHEN OTHERS THEN "
                   "RAISE EXCEPTION 'replay on pid % refused: %', pg_backend_pid(), SQLERRM; END;")
        b = app.job("CREATE JOB app.b SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.replay() "
                    "WITH (max_attempts = 1)")
        held.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
        wait_for(lambda: [h["status"] for h in app.history(a)] == ["failed"])
        with _as_principal(app) as other:
            assert _start_refused(other, job, planned, mac) == "RXT01"
        wait_for(lambda: len(app.history(b)) > 0 and app.history(b)[0]["status"] != "running")
    (hb,) = app.history(b)
    assert f"replay on pid {pid} refused" in str(hb["error"]), hb  # the same backend
    assert "the tick is not this session's to run" in str(hb["error"]), hb
    assert [h["status"] for h in app.history(a)] == ["failed"]
    assert app.effects() == []


@pytest.mark.parametrize("statement", [
    "SELECT * FROM radix.find_ticks('n', 10, 0, '{}', '{}')",
    "SELECT * FROM radix.claim_tick('n', gen_random_uuid(), 0, gen_random_uuid(), 300, true, now())",
    "SELECT radix.lease_work_due('n')",
    "SELECT radix._tick_token(gen_random_uuid(), 0, 0, now())",
    "SELECT * FROM radix.tick_locks FOR UPDATE",
    "SELECT * FROM radix._running_elsewhere('n', '{}')",
])
def test_the_finder_and_the_tick_claim_are_the_schedulers_alone(app: App, statement: str) -> None:
    with _as_principal(app) as principal, pytest.raises(psycopg.Error) as refused:
        principal.execute(statement.encode())
    assert refused.value.sqlstate == "42501", refused.value


def test_a_procedure_raising_the_ticks_own_sqlstate_is_recorded_as_its_failure(app: App) -> None:
    """RXT01 in run_tick's row means 'not this node's tick: record nothing'. A procedure raising it itself
    must not hide its failures (and so escape the attempt count and the backoff): a tick still as found
    and free is claimed and its failure recorded."""
    _procedure(app, "app.hides", "CALL app.record('x'); RAISE EXCEPTION 'not mine' USING ERRCODE = 'RXT01';")
    name = app.job("CREATE JOB app.hider SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.hides() "
                   "WITH (max_attempts = 3)")
    app.run()
    (h,) = app.history(name)
    assert (h["status"], h["attempt"]) == ("failed", 1), h  # a raised exception is not retried
    assert h["error"]["sqlstate"] == "RXT01", h
    assert app.state(name)["status"] == "failed"
    assert app.effects() == []
