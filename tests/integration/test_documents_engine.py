"""CRON_TABLE documents run as the engine's work: one daemon's slots, one node, one cap for jobs and documents."""

from __future__ import annotations

import asyncio
import itertools
import time

from radixjobs import documents
from radixjobs.documents import Documents
from radixjobs.engine import Engine
from radixjobs.server import Daemon, DaemonConfig
from tests.apps import App

HOLD_SQL = """
CREATE PROCEDURE app.hold_job() LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.6); CALL app.record('job'); END $$;
CREATE FUNCTION app.hold_doc() RETURNS void LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.6); CALL app.record('doc'); END $$;
GRANT EXECUTE ON PROCEDURE app.hold_job() TO {p};
GRANT EXECUTE ON FUNCTION app.hold_doc() TO {p};
"""
# principal backends running something now (the engine's attempts and its documents' DB_FUNCTION calls)
RUNNING = ("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
           "AND application_name = 'radixjobs-attempt' AND state = 'active'")
LIVE_NODES = "SELECT count(*) FROM radix.nodes n WHERE radix.node_alive(n.node_id)"


def test_a_daemon_runs_jobs_and_documents_in_its_concurrency_as_one_node(app: App) -> None:
    app.conn.execute(HOLD_SQL.format(p=app.principal).encode())
    for n in range(8):
        app.job(f"CREATE JOB app.hold_{n} SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {{p}} CALL app.hold_job()")
    documents.apply(app.conn, [{"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": 700 + n, "DB_FUNCTION": "app.hold_doc", "RUN_AS": app.principal, "FIRST_RUN": "2020-01-01T00:00:00",
        "INTERVAL": "now() + interval '1 day'"}} for n in range(8)])

    def tags() -> list[str]:
        return [str(row[0]) for row in app.conn.execute("SELECT tag FROM app.effects").fetchall()]

    async def go() -> tuple[int, set[int]]:
        daemon = Daemon(DaemonConfig(dsn=app.dsn, concurrency=4, per_database_concurrency=4, max_per_principal=0,
                                     poll_s=0.05, discovery_s=0.2, grace_s=5.0))
        task = asyncio.create_task(daemon.run())
        most, nodes = 0, set()
        deadline = time.monotonic() + 120
        try:
            while sorted(set(tags())) != ["doc", "job"] or len(tags()) < 16:
                assert time.monotonic() < deadline, f"not every job and document ran: {tags()}"
                assert not task.done(), task
                most = max(most, int(app.conn.execute(RUNNING).fetchone()[0]))  # type: ignore[index]
                nodes.add(int(app.conn.execute(LIVE_NODES).fetchone()[0]))  # type: ignore[index]
                await asyncio.sleep(0.02)
        finally:
            daemon.stop()
            await asyncio.wait_for(task, 60)
        return most, nodes

    most, nodes = asyncio.run(go())
    assert sorted(tags()) == ["doc"] * 8 + ["job"] * 8
    assert 0 < most <= 4  # jobs and documents share the 4 slots
    assert nodes <= {0, 1}  # one node row for the daemon (0 only before it registered)
    (processes,) = app.conn.execute("SELECT count(DISTINCT node) FROM radix.sys_processes").fetchone()  # type: ignore[misc]
    assert processes == 1  # the documents' processes carry the engine's node



SPANS_SQL = """
CREATE TABLE app.spans (tag text, s timestamptz, e timestamptz);
CREATE PROCEDURE app.span_job() LANGUAGE plpgsql AS $$
DECLARE t timestamptz := clock_timestamp();
BEGIN PERFORM pg_sleep(0.5); INSERT INTO app.spans VALUES ('job', t, clock_timestamp()); END $$;
CREATE FUNCTION app.span_doc() RETURNS void LANGUAGE plpgsql AS $$
DECLARE t timestamptz := clock_timestamp();
BEGIN PERFORM pg_sleep(0.5); INSERT INTO app.spans VALUES ('doc', t, clock_timestamp()); END $$;
GRANT INSERT ON app.spans TO {p};
GRANT EXECUTE ON PROCEDURE app.span_job() TO {p};
GRANT EXECUTE ON FUNCTION app.span_doc() TO {p};
"""


def test_the_cap_per_principal_counts_jobs_and_documents_together(app: App) -> None:
    app.conn.execute(SPANS_SQL.format(p=app.principal).encode())
    for n in range(2):
        app.job(f"CREATE JOB app.span_{n} SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {{p}} CALL app.span_job()")
    documents.apply(app.conn, [{"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": 800 + n, "DB_FUNCTION": "app.span_doc", "RUN_AS": app.principal, "FIRST_RUN": "2020-01-01T00:00:00",
        "INTERVAL": "now() + interval '1 day'"}} for n in range(2)])

    async def go() -> None:
        async with Engine(app.dsn, concurrency=4, max_per_principal=1, work=Documents(entry_points=False)) as engine:
            await engine.run_due()

    asyncio.run(go())
    spans = app.conn.execute("SELECT tag, s, e FROM app.spans ORDER BY s").fetchall()
    assert sorted(tag for tag, _, _ in spans) == ["doc", "doc", "job", "job"]
    for (_, _, end), (_, start, _) in itertools.pairwise(spans):
        assert end <= start, spans  # one at a time: the principal's cap is 1, whatever the kind


BACKLOG_SQL = """
CREATE PROCEDURE app.busy_job() LANGUAGE plpgsql AS $$
BEGIN PERFORM pg_sleep(0.1); CALL app.record('job'); END $$;
CREATE FUNCTION app.busy_doc() RETURNS void LANGUAGE plpgsql AS $$
BEGIN CALL app.record('doc'); END $$;
GRANT EXECUTE ON PROCEDURE app.busy_job() TO {p};
GRANT EXECUTE ON FUNCTION app.busy_doc() TO {p};
"""


def test_a_backlog_of_ticks_does_not_starve_a_due_document(app: App) -> None:
    """One slot, 30 due ticks: the document that found the slot taken is offered it when it frees, before
    the ticks (which take it next): it runs second, not after the backlog."""
    app.conn.execute(BACKLOG_SQL.format(p=app.principal).encode())
    for n in range(30):
        app.job(f"CREATE JOB app.busy_{n} SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {{p}} CALL app.busy_job()")
    documents.apply(app.conn, [{"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": 900, "DB_FUNCTION": "app.busy_doc", "RUN_AS": app.principal, "FIRST_RUN": "2020-01-01T00:00:00",
        "INTERVAL": "now() + interval '1 day'"}}])

    async def go() -> None:
        async with Engine(app.dsn, concurrency=1, max_per_principal=0, work=Documents(entry_points=False)) as engine:
            await engine.run_due()

    asyncio.run(go())
    tags = [str(row[1]) for row in app.effects()]
    assert sorted(tags) == ["doc"] + ["job"] * 30
    assert tags.index("doc") <= 2, tags  # ticks and the document take turns at the one slot
