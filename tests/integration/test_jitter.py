"""Jitter (``WITH (jitter = …)``): each tick becomes due at a deterministic offset in [0, jitter) from its
planned time, the same in every session (radix._jitter_ns, a hash of the tick's idempotency key); the
planned time and the idempotency key stay on the grid."""

from __future__ import annotations

import psycopg
import pytest

from radixjobs.errors import AdmissionError
from tests.apps import App

MINUTE_NS = 60 * 10**9
HOUR_NS = 60 * MINUTE_NS

OFFSETS = """
SELECT radix._jitter_ns(j.job_id, t, j.jitter_ns)
FROM radix.jobs j, generate_series(0::bigint, 1000 * %(step)s::bigint, %(step)s::bigint) AS g(t)
ORDER BY t
"""


def _offset(app: App, name: str, tick_ns: int) -> int:
    row = app.conn.execute("SELECT radix._jitter_ns(job_id, %s, jitter_ns) FROM radix.jobs j "
                           "WHERE job_id = (SELECT job_id FROM radix.job_overview WHERE name = %s)",
                           (tick_ns, name)).fetchone()
    assert row is not None
    return int(row[0])


def test_offsets_are_deterministic_within_the_jitter_and_the_same_in_every_session(app: App) -> None:
    app.job("CREATE JOB app.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('j') "
            "WITH (jitter = '30 seconds')")
    first = [r[0] for r in app.conn.execute(OFFSETS, {"step": HOUR_NS}).fetchall()]
    assert all(0 <= x < 30 * 10**9 for x in first)
    assert len(set(first)) > 990  # spread, not a constant
    assert max(first) > 25 * 10**9
    assert min(first) < 5 * 10**9
    with psycopg.connect(app.dsn) as other:  # another session, as another node's
        assert [r[0] for r in other.execute(OFFSETS, {"step": HOUR_NS}).fetchall()] == first
    assert [r[0] for r in app.conn.execute(OFFSETS, {"step": HOUR_NS}).fetchall()] == first


def test_a_tick_is_due_at_its_offset_and_keeps_its_grid_time_and_key(app: App) -> None:
    name = app.job("CREATE JOB app.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('j') "
                   "WITH (jitter = '30 minutes')")
    state = app.state(name)
    planned = state["planned_ns"]
    assert state["due_ns"] == planned + _offset(app, name, planned)
    app.make_due(name)
    assert app.run().counters["successes"] == 1
    (ran,) = app.history(name)
    assert (ran["planned_ns"], ran["idempotency_key"]) == (planned, f"{state['job_id']}/{planned}")
    assert app.effects()[0][6] == f"{state['job_id']}/{planned}"  # radix.current_idempotency_key()
    after = app.state(name)
    assert after["planned_ns"] == planned + HOUR_NS
    assert after["due_ns"] == planned + HOUR_NS + _offset(app, name, planned + HOUR_NS)


def test_alter_set_and_reset_move_the_due_time_not_the_tick(app: App) -> None:
    name = app.job("CREATE JOB app.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('j')")
    planned = app.state(name)["planned_ns"]
    assert (app.state(name)["jitter_ns"], app.state(name)["due_ns"]) == (None, planned)
    app.job("ALTER JOB app.j SET (jitter = '10 minutes')")
    state = app.state(name)
    assert (state["jitter_ns"], state["planned_ns"]) == (10 * MINUTE_NS, planned)
    assert state["due_ns"] == planned + _offset(app, name, planned)
    app.job("ALTER JOB app.j RESET (jitter)")
    state = app.state(name)
    assert (state["jitter_ns"], state["planned_ns"], state["due_ns"]) == (None, planned, planned)


def test_a_cron_tick_is_planned_on_its_time_and_due_at_its_offset(app: App) -> None:
    name = app.job("CREATE JOB app.c SCHEDULE CRON '0 * * * *' RUN AS {p} CALL app.record('c') "
                   "WITH (jitter = '20 minutes')")
    app.run()  # plans the first tick
    state = app.state(name)
    assert state["planned_ns"] % HOUR_NS == 0
    assert state["due_ns"] == state["planned_ns"] + _offset(app, name, state["planned_ns"])


@pytest.mark.parametrize("ddl", [
    "CREATE JOB app.k SCHEDULE EVERY INTERVAL '1 minute' RUN AS {p} CALL app.record('k') WITH (jitter = '1 minute')",
    "ALTER JOB app.j SET (jitter = '2 hours')",
    "ALTER JOB app.j SET SCHEDULE EVERY INTERVAL '10 minutes'",
])
def test_a_jitter_of_an_every_job_must_be_less_than_its_interval(app: App, ddl: str) -> None:
    app.job("CREATE JOB app.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('j') "
            "WITH (jitter = '30 minutes')")
    with pytest.raises(AdmissionError, match="option jitter must be less than the schedule's interval") as caught:
        app.job(ddl)
    assert "\n" not in str(caught.value)
    assert app.state("app.j")["jitter_ns"] == 30 * MINUTE_NS


def test_the_offset_and_the_deadline_are_inlined_into_their_callers(app: App) -> None:
    """radix._advanced (in the lone tick's end_tick), radix._jitter_ns and radix._tick_missed (in its
    start_tick) stay plain SQL the planner inlines: no function call per tick (docs/hot-path.md)."""
    shown = "\n".join(r[0] for r in app.conn.execute(
        "EXPLAIN VERBOSE SELECT a.*, radix._tick_missed(j.job_id, 1, j.jitter_ns, j.start_deadline_ns, 2) "
        "FROM radix.jobs j, radix._advanced('every', 7, true, 1, 0, 'k', j.job_id, j.jitter_ns) a").fetchall())
    assert "radix._" not in shown, shown
    assert "hashtextextended" in shown


def test_create_or_replace_without_the_options_resets_them(app: App) -> None:
    ddl = "CREATE OR REPLACE JOB app.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('j') "
    name = "app.j"
    app.job(ddl + "WITH (jitter = '1 minute', start_deadline = '5 minutes')")
    assert (app.state(name)["jitter_ns"], app.state(name)["start_deadline_ns"]) == (MINUTE_NS, 5 * MINUTE_NS)
    app.job(ddl)
    state = app.state(name)
    assert (state["jitter_ns"], state["start_deadline_ns"], state["due_ns"]) == (None, None, state["planned_ns"])


def test_a_late_job_runs_its_newest_tick_whose_offset_is_over(app: App) -> None:
    """Coalescing chooses among the ticks that are due: the newest grid tick runs only once its offset is
    over, else the one before it runs, and the newest is next (due at its offset)."""
    name = app.job("CREATE JOB app.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('j') "
                   "WITH (jitter = '59 minutes')")
    # a grid time a second ago whose offset is still at least 2 minutes away (however slow the run to come)
    row = app.conn.execute(
        "SELECT c.g FROM radix.jobs j, (SELECT radix.to_ns(clock_timestamp()) - 1000000000 - i * 1000000 AS g "
        "FROM generate_series(0, 1000) AS i) c WHERE radix._jitter_ns(j.job_id, c.g, j.jitter_ns) > 120000000000 "
        "ORDER BY c.g DESC LIMIT 1").fetchone()
    assert row is not None
    newest = int(row[0])
    app.conn.execute("UPDATE radix.radix_system_job_state SET planned_ns = %(p)s, anchor_ns = %(p)s, due_ns = %(p)s",
                     {"p": newest - 2 * HOUR_NS})
    assert app.run().counters["successes"] == 1
    assert [h["planned_ns"] for h in app.history(name)] == [newest - HOUR_NS]
    state = app.state(name)
    assert (state["coalesced_ticks"], state["planned_ns"]) == (1, newest)
    assert state["due_ns"] == newest + _offset(app, name, newest)


def test_a_late_cron_job_keeps_its_due_tick_until_a_later_one_is_due_whatever_its_offset(app: App) -> None:
    """Cron planning replaces a due tick only by one that is due whatever its offset (J after it): with a
    jitter longer than the spacing of the ticks, a job a few ticks late still runs its planned tick."""
    name = app.job("CREATE JOB app.c SCHEDULE CRON '*/10 * * * * *' RUN AS {p} CALL app.record('c') "
                   "WITH (jitter = '1 minute')")
    # a tick 20 to 60 s ago whose offset is over (it is due), with later ticks that are over too (before
    # their offsets): none of those is due whatever its offset, so the planned one runs
    row = app.conn.execute(
        "SELECT c.g, c.g + radix._jitter_ns(j.job_id, c.g, j.jitter_ns) FROM radix.jobs j, "
        "(SELECT (radix.to_ns(clock_timestamp()) / 10000000000 - i) * 10000000000 AS g "
        " FROM generate_series(2, 5) AS i) c "
        "WHERE c.g + radix._jitter_ns(j.job_id, c.g, j.jitter_ns) <= radix.to_ns(clock_timestamp()) "
        "ORDER BY c.g LIMIT 1").fetchone()
    if row is None:
        pytest.skip("no tick of the last minute is due at its offset for this job id")
    planned, due = int(row[0]), int(row[1])
    app.conn.execute("UPDATE radix.radix_system_job_state SET planned_ns = %s, anchor_ns = %s, due_ns = %s",
                     (planned, planned - 10**10, due))
    app.run()
    ran = sorted(h["planned_ns"] for h in app.history(name))
    # the planned tick first, then each following one as it came due at its offset: none coalesced
    assert ran == [planned + i * 10**10 for i in range(len(ran))]
    assert app.state(name)["coalesced_ticks"] == 0
