"""The tick keeps its job's history at its limit from a count in the state row (0015_history_rows.sql):
exact while only ticks write history, unknown (and counted again by the next tick) once any other row is
written, including by a transaction that commits while the tick is about to write its count."""

from __future__ import annotations

from typing import Any

import psycopg

from radixjobs import catalog
from tests.apps import App, Background, holding, waiting_on
from tests.support import wait_for

LOCK = 86423


def _counts(app: App, name: str) -> tuple[int | None, int]:
    """(the state's history_rows, the job's history rows in fact)."""
    row = app.conn.execute("SELECT s.history_rows, (SELECT count(*) FROM radix.radix_system_job_history h "
                           "WHERE h.job_id = s.job_id) FROM radix.radix_system_job_state s "
                           "JOIN radix.job_overview o ON o.job_id = s.job_id WHERE o.name = %s", (name,)).fetchone()
    assert row is not None
    return row[0], int(row[1])


def _tick(app: App, name: str) -> None:
    app.make_due(name)
    assert app.run().counters["successes"] == 1


def _planned(app: App, name: str) -> list[int]:
    return [h["planned_ns"] for h in app.history(name)]


def test_ticks_keep_the_newest_rows_up_to_the_limit_by_the_count(app: App) -> None:
    name = app.job("CREATE JOB app.rec SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('r') "
                   "WITH (history = 3)")
    assert _counts(app, name) == (None, 0)  # a new job: unknown, counted by its first tick
    planned = []
    for ran in range(1, 7):
        planned.append(app.state(name)["planned_ns"])
        _tick(app, name)
        assert _counts(app, name) == (min(ran, 3), min(ran, 3))
    assert _planned(app, name) == planned[-3:]  # the oldest went first
    assert {h["status"] for h in app.history(name)} == {"succeeded"}


def test_a_row_written_off_the_tick_makes_the_count_unknown_and_the_next_tick_counts(app: App) -> None:
    app.conn.execute(b"CREATE TABLE app.fail (on_ boolean NOT NULL)")
    app.conn.execute(b"INSERT INTO app.fail VALUES (false)")
    app.conn.execute(f"GRANT SELECT ON app.fail TO {app.principal}".encode())
    app.conn.execute(b"CREATE PROCEDURE app.flaky() LANGUAGE plpgsql AS $$ BEGIN "
                     b"IF (SELECT on_ FROM app.fail) THEN RAISE EXCEPTION 'told to fail'; END IF; "
                     b"CALL app.record('f'); END $$")
    name = app.job("CREATE JOB app.flaky SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.flaky() "
                   "WITH (history = 4)")
    for _ in range(2):
        _tick(app, name)
    assert _counts(app, name) == (2, 2)
    epoch = app.conn.execute("SELECT history_epoch FROM radix.radix_system_job_state").fetchone()
    app.conn.execute(b"UPDATE app.fail SET on_ = true")
    app.make_due(name)
    app.run()  # fails: recorded on the lease path (a claim of that tick, its row written there)
    assert app.history(name)[-1]["status"] == "failed"
    assert _counts(app, name) == (None, 3)
    assert app.conn.execute("SELECT history_epoch FROM radix.radix_system_job_state").fetchone() != epoch
    app.conn.execute(b"UPDATE app.fail SET on_ = false")
    for ran in range(4, 8):
        _tick(app, name)
        assert _counts(app, name) == (min(ran, 4), min(ran, 4))


def test_lowering_the_limit_prunes_to_it_at_the_next_tick(app: App) -> None:
    name = app.job("CREATE JOB app.low SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('l') "
                   "WITH (history = 5)")
    for _ in range(4):
        _tick(app, name)
    newest = _planned(app, name)[-1]
    catalog.execute_job_ddl(app.conn, "ALTER JOB app.low SET (history = 2)")
    assert _counts(app, name) == (4, 4)  # kept until the next tick
    _tick(app, name)
    assert _counts(app, name) == (2, 2)
    assert _planned(app, name)[0] == newest


def test_a_row_committed_while_the_tick_writes_its_count_makes_it_unknown(app: App) -> None:
    """The tick has read a known count; before its state UPDATE, another transaction writes a history row
    of the job and commits. The tick's UPDATE sees the newer epoch and writes the count as unknown, so the
    job is pruned by the walk and never keeps more rows than its limit."""
    app.conn.execute(f"CREATE PROCEDURE app.waits() LANGUAGE plpgsql AS $$ BEGIN "
                     f"PERFORM pg_advisory_xact_lock({LOCK}); CALL app.record('w'); END $$".encode())
    name = app.job("CREATE JOB app.race SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.waits() "
                   "WITH (history = 2)")
    for _ in range(2):
        _tick(app, name)
    assert _counts(app, name) == (2, 2)
    job = app.state(name)["job_id"]
    app.make_due(name)
    with holding(app, LOCK) as held, Background(app.dsn, concurrency=1):
        pid, _ = waiting_on(app, LOCK)  # the tick runs, its procedure waits
        with psycopg.connect(app.dsn) as other:  # a transaction holding the state row against UPDATEs
            other.execute("SELECT 1 FROM radix.radix_system_job_state WHERE job_id = %s FOR NO KEY UPDATE",
                          (job,))
            held.execute("SELECT pg_advisory_unlock(%s)", (LOCK,))
            # end_tick has read the count and waits for the row: now a row of the job is written elsewhere
            wait_for(lambda: _waits_for_a_row(app.conn, pid), timeout=30)
            other.execute("SELECT radix.record_lost_tick('elsewhere', %s, 1, 1, now(), now(), NULL)", (job,))
            other.commit()
        wait_for(lambda: app.history(name) and app.history(name)[-1]["status"] == "succeeded"
                 and len([e for e in app.effects() if e[1] == "w"]) == 3, timeout=30)
    assert _counts(app, name) == (None, 2)
    _tick(app, name)
    assert _counts(app, name) == (2, 2)


def _waits_for_a_row(conn: psycopg.Connection[Any], pid: int) -> bool:
    row = conn.execute("SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
    return bool(row and row[0])
