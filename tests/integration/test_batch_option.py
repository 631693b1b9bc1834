"""Tick batches are opt-in (``WITH (batch = on)``): by default every attempt is its own transaction, as the
seed says; a job's ticks share a transaction only when its owner declared the procedure batch-safe, and
not once it is altered back (the engine's definition, by version; radix.start_ticks as the batch starts)."""

from __future__ import annotations

import psycopg
import pytest

from radixjobs.engine import Engine
from tests.apps import App, batch_outcomes, definitions, found_ticks, run_engine

pytestmark = pytest.mark.usefixtures("batchable")  # batches form whatever the machine's load

# Each tick records its transaction and the SET LOCAL it finds, then makes its own.
TXID = """
CREATE TABLE app.txids (tag text, txid bigint, seen text);
GRANT INSERT ON app.txids TO {p};
CREATE PROCEDURE app.txid(tag text) LANGUAGE plpgsql AS $$
BEGIN
  INSERT INTO app.txids VALUES (tag, txid_current(), nullif(current_setting('app.leak', true), ''));
  PERFORM set_config('app.leak', tag, true);
END $$;
"""


def _setup(app: App) -> None:
    app.conn.execute(TXID.format(p=f'"{app.principal}"').encode())


def _txids(app: App, like: str = "%") -> list[tuple[str, int, str | None]]:
    return app.conn.execute("SELECT tag, txid, seen FROM app.txids WHERE tag LIKE %s ORDER BY tag",
                            (like,)).fetchall()


@pytest.mark.parametrize("options", ["", "WITH (batch = off)", "WITH (batch = on)"])
def test_forty_due_ticks_of_one_principal_and_procedure_share_a_transaction_only_with_batch_on(
        app: App, options: str) -> None:
    _setup(app)
    for i in range(40):
        app.job(f"CREATE JOB app.t{i} SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {{p}} CALL app.txid('t{i}') {options}")
    engine = app.run(concurrency=1)
    rows = _txids(app)
    assert engine.counters["successes"] == 40
    assert sorted(tag for tag, _, _ in rows) == sorted(f"t{i}" for i in range(40))  # each once
    transactions = len({txid for _, txid, _ in rows})
    leaked = [(tag, seen) for tag, _, seen in rows if seen is not None]
    if options == "WITH (batch = on)":
        # the first alone (its procedure's duration not known yet), the others in batches of up to 32
        assert engine.counters["batched_ticks"] == 39
        assert transactions == 3
        assert leaked  # what a batch shares: a tick reads the SET LOCAL an earlier tick of it left
    else:
        assert engine.counters["batched_ticks"] == 0
        assert transactions == 40
        assert leaked == []  # no tick sees another's SET LOCAL


def test_the_option_is_stored_shown_altered_and_reset(app: App) -> None:
    _setup(app)
    name = app.job("CREATE JOB app.o SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.txid('o')")
    assert app.state(name)["batch_ticks"] is False
    version = app.state(name)["definition_version"]
    planned = app.state(name)["planned_ns"]
    app.job("ALTER JOB app.o SET (batch = on)")
    after = app.state(name)
    # a new definition version (the engine's cached definition is by version), the schedule kept
    assert (after["batch_ticks"], after["definition_version"], after["planned_ns"]) == (True, version + 1, planned)
    app.job("ALTER JOB app.o RESET (batch)")
    assert app.state(name)["batch_ticks"] is False
    app.conn.execute("SELECT radix.alter_job('app.o', options => '{\"batch\": true}')")
    assert app.state(name)["batch_ticks"] is True
    app.conn.execute("SELECT radix.create_job('app.p', '{\"every\": \"1 hour\"}', %s, 'app.txid', '{\"tag\": \"p\"}', "
                     "options => '{\"batch\": \"on\"}')", (app.principal,))
    assert app.state("app.p")["batch_ticks"] is True
    with pytest.raises(psycopg.Error, match="option batch must be on or off, not maybe"):
        app.conn.execute("SELECT radix.alter_job('app.o', options => '{\"batch\": \"maybe\"}')")


def test_a_job_altered_from_batch_on_to_off_is_not_batched_afterwards(app: App) -> None:
    """One engine throughout, its definitions cached: after ALTER JOB ... SET (batch = off) (or RESET), a
    job's ticks run each in its own transaction."""
    _setup(app)
    names = [app.job(f"CREATE JOB app.r{i} SCHEDULE EVERY INTERVAL '1 hour' RUN AS {{p}} CALL app.txid('r{i}') "
                     "WITH (batch = on)") for i in range(6)]

    async def rounds(engine: Engine) -> None:
        for name in names:
            app.make_due(name)
        await engine.run_due()
        assert engine.counters["batched_ticks"] >= 2  # batched while on
        batched = engine.counters["batched_ticks"]
        for i, name in enumerate(names):
            app.job(f"ALTER JOB {name} SET (batch = off)" if i % 2 else f"ALTER JOB {name} RESET (batch)")
            app.make_due(name)
        app.conn.execute("UPDATE app.txids SET tag = 'before ' || tag")
        await engine.run_due()
        assert engine.counters["batched_ticks"] == batched

    run_engine(app.dsn, rounds, concurrency=1)
    rows = _txids(app, "r%")
    assert len(rows) == 6
    assert len({txid for _, txid, _ in rows}) == 6
    assert all(seen is None for _, _, seen in rows)


def test_a_batch_does_not_start_a_tick_whose_job_was_altered_to_batch_off_since_it_was_found(app: App) -> None:
    """Defence in depth: ticks found while their jobs were batch = on, one of them altered to batch = off
    before the batch is sent (its definition as cached before the ALTER). radix.start_ticks does not start
    that one (RXT03: the daemon runs it alone afterwards); the others run in the batch."""
    _setup(app)
    names = [app.job(f"CREATE JOB app.d{i} SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {{p}} CALL app.txid('d{i}') "
                     "WITH (batch = on)") for i in range(3)]
    found = found_ticks(app)
    cached = definitions(app, found)
    assert len(found) == 3
    assert all(job.batch for job in cached.values())
    altered = app.state(names[1])["job_id"]
    app.job(f"ALTER JOB {names[1]} SET (batch = off)")
    outcomes = batch_outcomes(app, found, cached)
    assert outcomes[altered][:2] == ("begin", "RXT03")
    assert all(r[0] is None for job, r in outcomes.items() if job != altered)
    assert sorted(tag for tag, _, _ in _txids(app)) == ["d0", "d2"]
    assert app.state(names[1])["status"] == "scheduled"  # not run, still due: the daemon runs it alone
    assert app.history(names[1]) == []
    assert app.run(concurrency=1).counters["batched_ticks"] == 0
    assert sorted(tag for tag, _, _ in _txids(app)) == ["d0", "d1", "d2"]
