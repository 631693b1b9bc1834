"""The atomic attempt of the lease path is one simple query whose text the procedure and the principal's
other sessions can read: it carries a MAC of the lease token for the backend that runs it, never the token
(sql/routines/tokens.sql and lease.sql, engine/attempt.py). Each attack here reads the MAC through a real path
and tries to use it: from another session, inside the attempt's own transaction, and on the same backend later. The
jobs run by RUN JOB, whose requests take the lease path; the one-transaction tick's own MAC is attacked in
test_ticks.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from radixjobs import catalog
from tests.apps import App, Background, holding, waiting_on
from tests.support import wait_for

LOCK = 86420  # the procedures wait on this advisory lock, held by the test, so their attempt stays open
MAC = re.compile(r"radix\.begin_atomic\('([0-9a-f-]+)'::pg_catalog\.uuid, '([0-9a-f]+)'::pg_catalog\.text\)")


def _procedure(app: App, name: str, body: str) -> None:
    app.conn.execute(f"CREATE PROCEDURE {name}() LANGUAGE plpgsql AS $$ BEGIN {body} END $$".encode())


def _as_principal(app: App) -> psycopg.Connection[Any]:
    return psycopg.connect(app.dsn, user=app.principal, autocommit=True)


@pytest.fixture
def held(app: App) -> Iterator[psycopg.Connection[Any]]:
    """The advisory lock the procedures wait on, held by a superuser session until released."""
    with holding(app, LOCK) as conn:
        yield conn


def _waiting_attempt(app: App) -> tuple[int, str, str, str]:
    """The attempt waiting on LOCK as the principal's own session sees it in pg_stat_activity: its pid,
    its query text, and the job id and MAC read from that text."""
    pid, query = waiting_on(app, LOCK)
    found = MAC.search(query)
    assert found is not None, query
    job, mac = found.groups()
    return pid, query, job, mac


def test_the_query_carries_a_mac_that_no_other_session_can_use(app: App, held: psycopg.Connection[Any]) -> None:
    _procedure(app, "app.waits", f"PERFORM pg_advisory_xact_lock({LOCK}); CALL app.record('ran');")
    name = app.job("CREATE JOB app.mac SCHEDULE EVERY INTERVAL '1 day' RUN AS {p} CALL app.waits()")
    catalog.run_job(app.conn, name)
    with Background(app.dsn, concurrency=1):
        _, query, job, mac = _waiting_attempt(app)
        (token,) = app.conn.execute("SELECT lease_token FROM radix.radix_system_job_state WHERE job_id = %s",
                                    (job,)).fetchone() or (None,)
        assert token is not None
        assert str(token) not in query
        assert token.hex not in query
        with _as_principal(app) as other:
            for statement in ("SELECT radix.begin_atomic(%s, %s)", "SELECT radix.end_atomic(%s, %s, NULL)"):
                with pytest.raises(psycopg.Error) as refused:
                    other.execute(statement, (job, mac))
                assert refused.value.sqlstate == "RXL01"
        held.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
        wait_for(lambda: app.history(name) and app.history(name)[-1]["status"] == "succeeded")
    assert [e[1] for e in app.effects()] == ["ran"]


def test_ending_its_own_attempt_early_with_the_mac_rolls_everything_back(app: App) -> None:
    """The procedure reads its MAC from current_query() and marks its tick done itself (far in the future):
    the daemon's own end then finds no frame, and the whole attempt rolls back."""
    _procedure(app, "app.forge",
               "PERFORM radix.end_atomic(radix.current_job_id(), substring(current_query() "
               "FROM 'begin_atomic\\(''[^'']+''::pg_catalog.uuid, ''([0-9a-f]+)'''), 4102444800000000000); "
               "CALL app.record('forged');")
    name = app.job("CREATE JOB app.forger SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.forge()")
    planned = app.state(name)["planned_ns"]
    catalog.run_job(app.conn, name)
    app.run(max_per_principal=1)
    (h,) = app.history(name)
    assert h["status"] != "succeeded"
    assert "frame of this attempt is gone" in str(h["error"]), h
    assert app.effects() == []
    # the tick failed (recorded by the daemon) and the job stays on its grid, not in the year 2100
    assert h["status"] == "failed", h
    assert app.state(name)["planned_ns"] in (planned, planned + 3600 * 10**9)


def test_a_mac_replayed_on_the_same_backend_after_its_attempt_is_refused(
        app: App, held: psycopg.Connection[Any]) -> None:
    """Job A's attempt is read from pg_stat_activity while it runs, then fails. Job B, same principal,
    runs next on the same backend (one slot) and replays A's MAC there: by then A's failure is recorded
    and its token gone, so the replay cannot mark A's tick done."""
    _procedure(app, "app.victim_body", f"PERFORM pg_advisory_xact_lock({LOCK}); RAISE EXCEPTION 'fails';")
    a = app.job("CREATE JOB app.a SCHEDULE EVERY INTERVAL '1 day' RUN AS {p} CALL app.victim_body()")
    catalog.run_job(app.conn, a)
    with Background(app.dsn, concurrency=1):
        pid, _, job, mac = _waiting_attempt(app)
        _procedure(app, "app.replay",
                   f"BEGIN PERFORM radix.begin_atomic('{job}', '{mac}'); "
                   f"PERFORM radix.end_atomic('{job}', '{mac}', NULL); CALL app.record('replayed'); "
                   "EXCEPTION WHEN OTHERS THEN "
                   "RAISE EXCEPTION 'replay on pid % refused: %', pg_backend_pid(), SQLERRM; END;")
        b = app.job("CREATE JOB app.b SCHEDULE EVERY INTERVAL '1 day' RUN AS {p} CALL app.replay()")
        catalog.run_job(app.conn, b)
        held.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
        wait_for(lambda: len(app.history(b)) > 0 and app.history(b)[0]["status"] != "running")
    (hb, *_) = app.history(b)
    assert f"replay on pid {pid} refused" in str(hb["error"]), hb  # the same backend
    assert "the claim of this attempt is no longer held" in str(hb["error"]), hb
    assert all(h["status"] != "succeeded" for h in app.history(a))
    assert app.effects() == []
