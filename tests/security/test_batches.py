"""Tick batches (0015_tick_batches.sql, 0016_batch_end.sql, engine/batches.py) share one transaction and one
query text among their ticks, so a tick's code can reach the other ticks: their MACs are in current_query(),
and its SET LOCALs outlive it. The attacks run through the real path (the engine forming batches from a
backlog): a tick that switches role must not hand that role to the next tick; a tick that reads the MACs of
the batch and ends the ticks after it must find none of another owner's; and one that ends a tick before it
(run, its marker not yet written) must roll the whole batch back, each tick then run alone, once."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg import sql

from radixjobs import catalog
from radixjobs.engine import ticks
from tests.apps import App, run_engine


@pytest.fixture(autouse=True)
def short(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every procedure counts as short once it has run, whatever the machine's load (BATCH_TICK_MS)."""
    monkeypatch.setattr(ticks, "BATCH_TICK_MS", 60_000.0)


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
        app.job(f"CREATE JOB app.{tag} SCHEDULE AT TIMESTAMP '2020-01-0{day}' RUN AS {{p}} CALL app.turns('{tag}')")
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
    macs := string_to_array(replace(arrays[4], '''', ''), ', ');
    own := array_position(jobs, radix.current_job_id()::text);
    -- 'a': the ticks after it, 'e': the ticks before it (which ran, their markers not yet written)
    FOR i IN 1 .. cardinality(jobs) LOOP
      IF (tag LIKE 'a%' AND i > own) OR (tag LIKE 'e%' AND i < own) THEN
        BEGIN
          PERFORM radix.begin_tick(jobs[i]::uuid, planned[i]::bigint, macs[i]);
          PERFORM radix.end_tick(jobs[i]::uuid, macs[i], NULL, '41');
          INSERT INTO app.effects (tag) VALUES ('ended ' || jobs[i]);
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
      END IF;
    END LOOP;
  END IF;
  CALL app.record(tag);
END $$
"""


def test_a_tick_that_ends_the_ticks_of_its_batch_finds_none_of_another_owner(app: App, roles: Any,
                                                                             login: Any) -> None:
    tenant = roles("tenant")
    _grant(app, "GRANT USAGE, CREATE ON SCHEMA app TO {0}; GRANT {1} TO {0}", tenant, app.principal)
    app.conn.execute(HOSTILE.encode())
    tenant_conn = login(tenant)
    app.job("CREATE JOB app.lead SCHEDULE AT TIMESTAMP '2019-01-01' RUN AS {p} CALL app.hostile('lead')")
    for i in range(8):  # the two owners' ticks due in turn, one procedure, one principal
        app.job(f"CREATE JOB app.a{i} SCHEDULE AT TIMESTAMP '2020-01-0{i + 1}' RUN AS {{p}} CALL app.hostile('a{i}')")
        catalog.execute_job_ddl(tenant_conn, f"CREATE JOB app.b{i} SCHEDULE AT TIMESTAMP '2020-01-0{i + 1}' "
                                             f"RUN AS {app.principal} CALL app.hostile('b{i}')")
    engine = run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)
    assert engine.counters["batched_ticks"] >= 8
    tags = [e[1] for e in app.effects()]
    # every tick of the tenant's ran, once: none was ended unrun by the other owner's code
    assert sorted(t for t in tags if t.startswith("b")) == [f"b{i}" for i in range(8)]
    ended = {t.removeprefix("ended ") for t in tags if t.startswith("ended ")}
    assert ended  # the attack works where it can: on its own owner's ticks after it, in its batch
    owners = dict(app.conn.execute("SELECT job_id::text, owner_name FROM radix.jobs").fetchall())
    assert {owners[job] for job in ended} == {app.conn.info.user}  # only its own owner's
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
    app.job("CREATE JOB app.lead SCHEDULE AT TIMESTAMP '2019-01-01' RUN AS {p} CALL app.hostile('lead')")
    for i in range(6):
        app.job(f"CREATE JOB app.e{i} SCHEDULE AT TIMESTAMP '2020-01-0{i + 1}' RUN AS {{p}} CALL app.hostile('e{i}')")
    engine = run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)
    assert engine.counters["batched_ticks"] >= 2
    tags = [e[1] for e in app.effects()]
    assert sorted(tags) == ["e0", "e1", "e2", "e3", "e4", "e5", "lead"]  # each once, none ended unrun
    started = _started_by_job(app)
    assert len(started) == 7
    assert len(set(started.values())) == 7  # each in its own transaction: alone
