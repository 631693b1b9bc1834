"""Tick batches (sql/routines/batch.sql, engine/batches.py) share one transaction and one
query text among their ticks, so a tick's code can reach the other ticks: their MACs are in current_query(),
and its SET LOCALs outlive it. The attacks run through the real path (the engine forming batches from a
backlog): a tick that switches role must not hand that role to the next tick; a tick that reads the MACs of
the batch and ends the ticks after it (started with the batch) or a tick before it (run, its marker not
yet written) must roll the whole batch back, each tick then run alone, once. A batched tick's frame is a setting
with a MAC: a procedure that sets it to a frame saved from an earlier batch, or to one it made up, does
not become that tick."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import sql

from radixjobs import catalog
from tests.apps import App, run_engine

pytestmark = pytest.mark.usefixtures("batchable")  # batches form whatever the machine's load


def _grant(app: App, text: str, *roles: str) -> None:
    app.conn.execute(sql.SQL(text).format(*(sql.Identifier(r) for r in roles)))


def _started_by_job(app: App) -> dict[str, Any]:
    rows = app.conn.execute("SELECT j.job_name, h.started_at FROM radix.radix_system_job_history h "
                            "JOIN radix.jobs j USING (job_id) WHERE h.status = 'succeeded'").fetchall()
    return dict(rows)


def test_a_role_switched_by_a_tick_does_not_reach_the_next_tick_of_its_batch(app: App, roles: Any) -> None:
    other = roles("other", "NOLOGIN")
    _grant(app, "GRANT {0} TO {1}", other, app.principal)
    app.conn.execute(sql.SQL(
        "CREATE PROCEDURE app.turns(tag text) LANGUAGE plpgsql AS $$ BEGIN "
        "IF tag = 'switch' THEN SET LOCAL ROLE {0}; RETURN; END IF; CALL app.record(tag); END $$").format(
        sql.Identifier(other)))
    # due in this order: the lead alone, then a batch of a, switch, b, c
    for day, tag in enumerate(["lead", "a", "switch", "b", "c"], 1):
        app.job(f"CREATE JOB app.{tag} SCHEDULE AT TIMESTAMP '2020-01-0{day}' RUN AS {{p}} CALL app.turns('{tag}') "
                f"WITH (batch = on)")
    engine = run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)
    assert engine.counters["batched_ticks"] == 4
    effects = app.effects()
    assert sorted(e[1] for e in effects) == ["a", "b", "c", "lead"]  # each once
    assert {e[2] for e in effects} == {app.principal}  # none ran as the role the switch took
    started = _started_by_job(app)
    assert len(started) == 5  # the switch succeeded too (its own choice of role, inside its tick)
    # b and c were not run in the batch after the switch (RXT02), but alone, each in its own transaction
    assert started["a"] == started["switch"]
    assert len({started["a"], started["b"], started["c"]}) == 3


HOSTILE = r"""
CREATE PROCEDURE app.hostile(tag text) LANGUAGE plpgsql AS $$
DECLARE
  arrays text[];
  jobs text[];
  planned text[];
  attempts text[];
  macs text[];
  own integer;
BEGIN
  -- the ticks of this batch, as the query text gives them (radix.run_ticks' arrays: jobs, ticks, attempts,
  -- MACs, ...); none when the tick runs alone
  SELECT array_agg(r.m[1] ORDER BY r.n) INTO arrays
  FROM regexp_matches(current_query(), 'ARRAY\[([^]]*)\]', 'g') WITH ORDINALITY AS r(m, n);
  IF (tag LIKE 'a%' OR tag LIKE 'e%') AND arrays IS NOT NULL THEN
    jobs := string_to_array(replace(arrays[1], '''', ''), ', ');
    planned := string_to_array(replace(arrays[2], '''', ''), ', ');
    attempts := string_to_array(replace(arrays[3], '''', ''), ', ');
    macs := string_to_array(replace(arrays[4], '''', ''), ', ');
    own := array_position(jobs, radix.current_job_id()::text);
    -- 'a': the ticks after it, 'e': the ticks before it (which ran, their markers not yet written)
    FOR i IN 1 .. cardinality(jobs) LOOP
      IF (tag LIKE 'a%' AND i > own) OR (tag LIKE 'e%' AND i < own) THEN
        BEGIN
          IF (SELECT s.error_sqlstate FROM radix.start_tick(jobs[i]::uuid, planned[i]::bigint, macs[i]) s)
             IS NOT NULL THEN
            RAISE 'refused';
          END IF;
          PERFORM radix.end_tick(jobs[i]::uuid, planned[i]::bigint, attempts[i]::integer, macs[i], NULL, '41');
          INSERT INTO app.effects (tag) VALUES ('ended ' || jobs[i]);
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
      END IF;
    END LOOP;
  END IF;
  CALL app.record(tag);
END $$
"""


def test_a_tick_that_ends_the_ticks_after_it_in_its_batch_ends_none(app: App, roles: Any, login: Any) -> None:
    # The ticks after it were started with the batch (radix.start_ticks): one that the hostile code ends
    # (its state advanced) still runs, and end_ticks then finds it no longer as it began: the whole batch
    # rolls back, and each tick runs alone, where the query text carries no other tick's MAC.
    tenant = roles("tenant")
    _grant(app, "GRANT USAGE, CREATE ON SCHEMA app TO {0}; GRANT {1} TO {0}", tenant, app.principal)
    app.conn.execute(HOSTILE.encode())
    tenant_conn = login(tenant)
    app.job("CREATE JOB app.lead SCHEDULE AT TIMESTAMP '2019-01-01' RUN AS {p} CALL app.hostile('lead') "
            "WITH (batch = on)")
    for i in range(8):  # the two owners' ticks due in turn, one procedure, one principal
        app.job(f"CREATE JOB app.a{i} SCHEDULE AT TIMESTAMP '2020-01-0{i + 1}' RUN AS {{p}} CALL app.hostile('a{i}') "
                f"WITH (batch = on)")
        catalog.execute_job_ddl(tenant_conn, f"CREATE JOB app.b{i} SCHEDULE AT TIMESTAMP '2020-01-0{i + 1}' "
                                             f"RUN AS {app.principal} CALL app.hostile('b{i}') WITH (batch = on)")
    engine = run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)
    assert engine.counters["batched_ticks"] >= 8
    tags = [e[1] for e in app.effects()]
    # every tick ran, once; none was ended unrun
    assert sorted(tags) == sorted(["lead", *(f"a{i}" for i in range(8)), *(f"b{i}" for i in range(8))])
    started = _started_by_job(app)
    assert len({started[f"a{i}"] for i in range(8)}) == 8  # the attacked batch rolled back: each ran alone
    assert len({started[f"b{i}"] for i in range(8)}) == 1  # the other owner's batch, not attacked, committed
    # no batch held both owners' ticks
    rows = app.conn.execute("SELECT h.started_at, array_agg(DISTINCT j.owner_name) FROM "
                            "radix.radix_system_job_history h JOIN radix.jobs j USING (job_id) "
                            "GROUP BY h.started_at").fetchall()
    assert all(len(owners_of_batch) == 1 for _, owners_of_batch in rows)


def test_a_tick_that_ends_an_earlier_tick_of_its_batch_rolls_the_batch_back(app: App) -> None:
    # An earlier tick has run, its marker not yet written (radix.end_ticks writes them all at the end of the
    # batch's statement): a later tick's code that reads its MAC and ends it changes its state, end_ticks sees
    # the change and the whole batch rolls back. Each tick then runs alone: once, none ended unrun.
    app.conn.execute(HOSTILE.encode())
    app.job("CREATE JOB app.lead SCHEDULE AT TIMESTAMP '2019-01-01' RUN AS {p} CALL app.hostile('lead') "
            "WITH (batch = on)")
    for i in range(6):
        app.job(f"CREATE JOB app.e{i} SCHEDULE AT TIMESTAMP '2020-01-0{i + 1}' RUN AS {{p}} CALL app.hostile('e{i}') "
                f"WITH (batch = on)")
    engine = run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)
    assert engine.counters["batched_ticks"] >= 2
    tags = [e[1] for e in app.effects()]
    assert sorted(tags) == ["e0", "e1", "e2", "e3", "e4", "e5", "lead"]  # each once, none ended unrun
    started = _started_by_job(app)
    assert len(started) == 7
    assert len(set(started.values())) == 7  # each in its own transaction: alone


REPLAY = r"""
CREATE TABLE app.saved (frame text);
GRANT INSERT, SELECT ON app.saved TO {0};
CREATE PROCEDURE app.replays(tag text) LANGUAGE plpgsql AS $$
BEGIN
  IF tag LIKE 'save%' THEN
    INSERT INTO app.saved VALUES (current_setting('radix.tick', true));
  ELSIF tag LIKE 'replay%' THEN
    -- a frame saved from another transaction, then one made up for a job of its own owner
    PERFORM set_config('radix.tick', (SELECT max(s.frame) FROM app.saved s), true);
    CALL app.record(tag || ' saved');
    PERFORM set_config('radix.tick', (SELECT j.job_id::text FROM radix.job_overview j WHERE j.name = 'app.save0')
                                     || '/1/0/' || encode(sha256('forged'), 'hex'), true);
    CALL app.record(tag || ' made up');
  END IF;
END $$
"""


def test_a_frame_saved_from_another_batch_or_made_up_is_not_taken(app: App) -> None:
    app.conn.execute(sql.SQL(REPLAY).format(sql.Identifier(app.principal)))
    app.job("CREATE JOB app.lead SCHEDULE AT TIMESTAMP '2019-01-01' RUN AS {p} CALL app.replays('lead') "
            "WITH (batch = on)")
    for i in range(4):  # a batch that saves its frames
        app.job(f"CREATE JOB app.save{i} SCHEDULE AT TIMESTAMP '2020-01-0{i + 1}' RUN AS {{p}} "
                f"CALL app.replays('save{i}') WITH (batch = on)")
    engine = run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)
    assert engine.counters["batched_ticks"] == 4
    saved = [r[0] for r in app.conn.execute("SELECT frame FROM app.saved").fetchall()]
    assert len(saved) == 4
    assert all(f and f.count("/") == 3 for f in saved), saved  # each batched tick had its frame there
    # then, in a new engine, ticks that replay them: the first alone (its procedure's duration not known yet),
    # the others in a batch
    names = {f"replay{i}": app.job(f"CREATE JOB app.replay{i} SCHEDULE AT TIMESTAMP '2021-01-0{i + 1}' "
                                   f"RUN AS {{p}} CALL app.replays('replay{i}') WITH (batch = on)") for i in range(4)}
    engine = run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)
    assert engine.counters["batched_ticks"] == 3
    saved_jobs = {app.state(f"app.save{i}")["job_id"] for i in range(4)}
    rows = app.conn.execute("SELECT tag, job FROM app.effects WHERE tag LIKE 'replay%'").fetchall()
    assert len(rows) == 8
    for tag, job in rows:
        assert job not in saved_jobs, tag  # neither frame was taken
        assert job is None, tag  # no frame row to fall back on, alone or in a batch: a tick has none
    assert {tag.split()[0] for tag, _ in rows} == set(names)
