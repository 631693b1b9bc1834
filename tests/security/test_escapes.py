"""Escapes from inside a job's procedure, and escalations from outside by roles that were not given the right.

Already covered elsewhere, and not repeated here: RESET ROLE / RESET SESSION AUTHORIZATION, SET SESSION
AUTHORIZATION / SET ROLE to a superuser, writing the state, history and frames, a forged end_attempt, the
frame GUC, the query_canceled trap (tests/integration/test_engine.py); who may schedule as whom through
DDL, the SQL API and RUN_AS, direct writes to the job catalog, impersonation through _create_job /
_change_job / _drop_job (test_admission.py, test_documents.py). Added here: every other ledger table and
scheduler verb, the lease token the frame exposes, lingering session state on the SAME pooled
connection, every way to outlive a deadline, signalling the scheduler, the node liveness locks,
document impersonation, and CSP services named by a document.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs import documents
from radixjobs.engine import Engine
from tests.apps import App
from tests.support import document_engine, wait_for

SNAPSHOT = {
    "frames": "SELECT pid, job_id, attempt, idempotency_key FROM radix.attempt_frames ORDER BY pid",
    "keys": "SELECT idempotency_key FROM radix.idempotency_keys ORDER BY 1",
    "nodes": "SELECT node_id, backend_pid, backend_start FROM radix.nodes WHERE node_id IN ('bystander', 'evil') "
             "ORDER BY 1",
    "documents": "SELECT num, status, version, props FROM radix.cron_table ORDER BY num",
    "processes": "SELECT id, status FROM radix.sys_processes ORDER BY id",
    "victim": "SELECT status, planned_ns, attempt, lease_token FROM radix.radix_system_job_state s "
              "JOIN radix.jobs j USING (job_id) WHERE j.job_name = 'victim'",
}


def _ledger(app: App) -> dict[str, list[tuple[Any, ...]]]:
    return {name: app.conn.execute(query.encode()).fetchall() for name, query in SNAPSHOT.items()}


def _procedure(app: App, body: str, name: str = "app.p") -> None:
    app.conn.execute(f"CREATE PROCEDURE {name}() LANGUAGE plpgsql AS $$ BEGIN {body} END $$".encode())


@pytest.fixture
def ledger(app: App) -> App:
    """The app with something in every ledger table: a victim job, a document, a process, a node."""
    app.job("CREATE JOB app.victim SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('victim')")
    app.conn.execute("CREATE FUNCTION public.noop() RETURNS void LANGUAGE sql AS $$ SELECT 1 $$")
    documents.apply(app.conn, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_PASSIVE", "props": {
        "NUM": 7, "DB_FUNCTION": "noop", "RUN_AS": app.principal}})
    app.conn.execute("SELECT radix.register_node('bystander', 'h', 1)")
    app.conn.execute("INSERT INTO radix.sys_processes (task_num, doc_version, type, target, started_at, node) "
                     "VALUES ('7', 1, 'db', 'noop', now(), 'bystander')")
    return app


LEDGER_WRITES = {
    "update frames": "UPDATE radix.attempt_frames SET attempt = 99;",
    "insert a frame": "INSERT INTO radix.attempt_frames VALUES (1, now(), radix.current_job_id(), 1, 0, 'k', "
                      "gen_random_uuid());",
    "begin_attempt with a guessed token": "PERFORM radix.begin_attempt(radix.current_job_id(), gen_random_uuid());",
    "begin_attempt of another job": "PERFORM radix.begin_attempt(job_id, gen_random_uuid()) FROM radix.jobs;",
    "end_attempt of another job": "PERFORM radix.end_attempt('{victim}', gen_random_uuid(), 0, true);",
    # the one-query attempt ( tests/security/test_attempt_mac.py reads and replays a real MAC)
    "begin_atomic with a guessed MAC": "PERFORM radix.begin_atomic(radix.current_job_id(), md5(random()::text));",
    "begin_atomic of another job with the session key": "PERFORM radix.begin_atomic('{victim}', "
                                                         "radix.attempt_session());",
    "end_atomic of another job": "PERFORM radix.end_atomic('{victim}', md5(random()::text), 0);",
    # the one-transaction tick ( tests/security/test_ticks.py reads and replays a real MAC): start_tick reports
    # its refusal instead of raising it, so the body raises on it
    "start_tick with a guessed MAC": "IF (SELECT s.error_sqlstate FROM radix.start_tick(radix.current_job_id(), 0, "
                                     "md5(random()::text)) s) IS NOT NULL THEN RAISE 'refused'; END IF;",
    "start_tick of another job with the session key": "IF (SELECT s.error_sqlstate FROM radix.start_tick('{victim}', "
                                                       "0, radix.attempt_session()) s) IS NOT NULL THEN "
                                                       "RAISE 'refused'; END IF;",
    "end_tick of its own tick with a guessed MAC": "PERFORM radix.end_tick(radix.current_job_id(), 0, 1, "
                                                   "md5(random()::text), 0, '41');",
    "end_tick of another job": "PERFORM radix.end_tick('{victim}', 0, 1, md5(random()::text), 0, '41');",
    "run_tick of another job": "IF (SELECT r.failed_at FROM radix.run_tick('{victim}', 0, 1, "
                               "radix.attempt_session(), 'CALL app.record(''ran'')', NULL, '41') r) IS NOT NULL "
                               "THEN RAISE 'refused'; END IF;",
    # tick batches
    "end_ticks of its own tick with a guessed MAC": "PERFORM radix.end_ticks(ARRAY[radix.current_job_id()], "
                                                    "ARRAY[0::bigint], ARRAY[1], ARRAY[md5(random()::text)], "
                                                    "ARRAY[NULL::bigint], ARRAY[true], '41');",
    "end_ticks of another job": "PERFORM radix.end_ticks(ARRAY['{victim}'::uuid], ARRAY[0::bigint], ARRAY[1], "
                                "ARRAY[md5(random()::text)], ARRAY[NULL::bigint], ARRAY[true], '41');",
    "run_ticks of another job": "IF (SELECT r.failed_at FROM radix.run_ticks(ARRAY['{victim}'::uuid], "
                                "ARRAY[0::bigint], ARRAY[1], ARRAY[radix.attempt_session()], "
                                "ARRAY['CALL app.record(''ran'')'], ARRAY[NULL::bigint], '41') r) IS NOT NULL "
                                "THEN RAISE 'refused'; END IF;",
    # a batch started at once, its ticks' frames a setting with a MAC
    "start_ticks of another job with the session key": "IF (SELECT s.error_sqlstate FROM radix.start_ticks("
                                                        "ARRAY['{victim}'::uuid], ARRAY[0::bigint], "
                                                        "ARRAY[radix.attempt_session()]) s) IS NOT NULL THEN "
                                                        "RAISE 'refused'; END IF;",
    "compute a frame's MAC": "PERFORM radix._tick_frame_mac('{victim}/1/0');",
    "name another job in the frame setting": "PERFORM set_config('radix.tick', '{victim}/1/0/' || "
                                             "encode(sha256('x'), 'hex'), true); IF radix.current_job_id() "
                                             "IS DISTINCT FROM '{victim}' THEN RAISE 'not taken'; END IF;",
    "find_ticks": "PERFORM * FROM radix.find_ticks('evil', 10, 0, '{{}}', '{{}}');",
    "claim_tick": "PERFORM * FROM radix.claim_tick('evil', '{victim}', 0, gen_random_uuid(), 300, true, now());",
    "record_lost_tick": "PERFORM radix.record_lost_tick('evil', '{victim}', 0, 1, now(), now(), NULL);",
    "lock the tick locks": "PERFORM 1 FROM radix.tick_locks FOR UPDATE;",
    "compute a tick token": "PERFORM radix._tick_token('{victim}', 0, 0, now());",
    "read the attempt secret": "PERFORM secret FROM radix.attempt_secret;",
    "compute a MAC": "PERFORM radix._attempt_mac(gen_random_uuid());",
    "compute a session key": "PERFORM radix._session_key();",
    "write idempotency keys": "INSERT INTO radix.idempotency_keys VALUES ('{victim}/1', '{victim}');",
    "delete idempotency keys": "DELETE FROM radix.idempotency_keys;",
    "write nodes": "INSERT INTO radix.nodes (node_id) VALUES ('evil');",
    "update nodes": "UPDATE radix.nodes SET backend_pid = pg_backend_pid();",
    "write documents": "UPDATE radix.cron_table SET status = 'CRON_TABLE_ACTIVE';",
    "insert a document": "INSERT INTO radix.cron_table (num, status, props, owner_oid, writer_oid, principal_oid) "
                         "VALUES ('evil', 'CRON_TABLE_ACTIVE', '{{}}', 10, 10, 10);",
    "write processes": "UPDATE radix.sys_processes SET status = 'completed';",
    "truncate history": "TRUNCATE radix.radix_system_job_history;",
    "claim_due": "PERFORM radix.claim_due('evil', 10);",
    "finish_attempt": "PERFORM radix.finish_attempt('{victim}', gen_random_uuid(), 'succeeded', NULL, 0, 0, true, "
                      "false);",
    "release_claims": "PERFORM radix.release_claims('bystander');",
    "register_node": "PERFORM radix.register_node('evil', 'h', 1);",
    "_advance": "PERFORM radix._advance('{victim}', gen_random_uuid(), 0, true, NULL);",
    "doc_start": "PERFORM radix.doc_start('7', NULL, 'evil', NULL);",
    "doc_record": "PERFORM radix.doc_record(id, true, NULL, NULL) FROM radix.document_processes;",
    "doc_finish": "PERFORM radix.doc_finish('7', 1, 1, 'CRON_TABLE_ACTIVE', NULL, 0, NULL, NULL);",
}


@pytest.mark.parametrize("body", LEDGER_WRITES.values(), ids=LEDGER_WRITES.keys())
def test_ledger_writes_from_inside_a_procedure_fail_and_change_nothing(ledger: App, body: str) -> None:
    victim = ledger.state("app.victim")["job_id"]
    _procedure(ledger, body.format(victim=victim) + " CALL app.record('after');")
    name = ledger.job("CREATE JOB app.esc SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.p()")
    before = _ledger(ledger)
    ledger.run()
    (h,) = ledger.history(name)
    assert h["status"] == "failed", h
    assert ledger.effects() == []
    assert _ledger(ledger) == before


def test_the_lease_token_is_not_readable_by_the_procedure(app: App) -> None:
    """The token is the only thing that lets a caller write the completion marker; a procedure must not see it."""
    _procedure(app, "INSERT INTO app.effects (tag) VALUES ((radix._frame()).lease_token::text);")
    app.job("CREATE JOB app.peek SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.p()")
    app.run()
    assert [e[1] for e in app.effects()] in ([], [None])


def test_a_non_atomic_procedure_cannot_forge_its_own_completion(app: App) -> None:
    """With the token from radix._frame(), a procedure that commits inside marks its tick done and moves its
    job to any time it likes (here: the year 2100), which only ALTER JOB by the owner may do."""
    _procedure(app, "PERFORM radix.end_attempt(radix.current_job_id(), (radix._frame()).lease_token, "
                    "4102444800000000000, true); COMMIT;")
    name = app.job("CREATE JOB app.forge SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.p()")
    planned = app.state(name)["planned_ns"]
    app.make_due(name)
    app.run()
    assert app.state(name)["planned_ns"] == planned + 3600 * 10**9  # the grid, not the procedure's choice


# -- lingering session state on the same pooled connection -------------------------------------------------------

DIRTY = """
    CREATE TEMP TABLE leftover (x int);
    LISTEN leftover_channel;
    PERFORM pg_advisory_lock(4711);
    SET search_path = evil, pg_temp;
    PREPARE leftover_statement AS SELECT 1;
    PERFORM set_config('leftover.value', 'dirty', false);
    SET default_transaction_read_only = on;
    SET ROLE {other};
"""
OBSERVE = """
    INSERT INTO app.observed SELECT pg_backend_pid(), jsonb_build_object(
        'temp table', to_regclass('pg_temp.leftover') IS NOT NULL,
        'listening', (SELECT count(*) FROM pg_listening_channels()),
        'advisory locks', (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()),
        'search_path', current_setting('search_path'),
        'prepared', (SELECT count(*) FROM pg_prepared_statements),
        'custom setting', coalesce(current_setting('leftover.value', true), ''),
        'read only', current_setting('default_transaction_read_only'),
        'user', current_user, 'session user', session_user);
"""
CLEAN_SESSION = {"temp table": False, "listening": 0, "advisory locks": 0, "search_path": '"$user", public',
                 "prepared": 0, "custom setting": "", "read only": "off"}


def test_session_state_left_behind_is_gone_for_the_next_attempt_on_the_same_connection(app: App, roles: Any) -> None:
    other = roles("other", "NOLOGIN")
    app.conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(other), sql.Identifier(app.principal)))
    app.conn.execute(sql.SQL("CREATE TABLE app.observed (pid int, state jsonb); GRANT INSERT ON app.observed TO {}; "
                             "GRANT INSERT ON app.observed TO {}").format(sql.Identifier(app.principal),
                                                                          sql.Identifier(other)))
    _procedure(app, "INSERT INTO app.observed VALUES (pg_backend_pid(), NULL);" + DIRTY.format(other=other),
               "app.dirty")
    _procedure(app, OBSERVE, "app.observe")
    app.job("CREATE JOB app.a_dirty SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.dirty()")
    app.job("CREATE JOB app.b_observe SCHEDULE AT TIMESTAMP '2020-01-02' RUN AS {p} CALL app.observe()")
    app.run(concurrency=1)  # one engine, one principal connection, reused for the second attempt
    rows = app.conn.execute("SELECT pid, state FROM app.observed ORDER BY state IS NOT NULL").fetchall()
    assert len(rows) == 2
    (dirty_pid, _), (observe_pid, state) = rows
    assert dirty_pid == observe_pid  # the same backend: its state was cleaned, not thrown away
    assert {k: state[k] for k in CLEAN_SESSION} == CLEAN_SESSION
    assert (state["user"], state["session user"]) == (app.principal, app.principal)


# -- deadlines ---------------------------------------------------------------------------------------------

TRAP = "LOOP BEGIN PERFORM pg_sleep(0.05); EXCEPTION WHEN query_canceled THEN NULL; END; END LOOP;"
EVASIONS = {
    "statement_timeout = 0": "SET statement_timeout = 0; PERFORM pg_sleep(600);",
    "transaction_timeout = 0": "SET statement_timeout = 0; SET transaction_timeout = 0; PERFORM pg_sleep(600);",
    "SET LOCAL statement_timeout = 0": "SET LOCAL statement_timeout = 0; PERFORM pg_sleep(600);",
    "disarmed and trapped": "SET statement_timeout = 0; SET transaction_timeout = 0; " + TRAP,
    "after COMMIT (non-atomic)": "COMMIT; SET statement_timeout = 0; PERFORM pg_sleep(600);",
    "trapped after COMMIT (non-atomic)": "COMMIT; " + TRAP,
}


@pytest.mark.parametrize("body", EVASIONS.values(), ids=EVASIONS.keys())
def test_no_way_to_outlive_the_deadline(app: App, body: str) -> None:
    _procedure(app, body)
    app.conn.execute("SELECT radix.create_job('app.evade', '{\"at\": \"2020-01-01\"}', %s, 'app.p', '[]', true, "
                     "false, 300)", (app.principal,))
    started = time.monotonic()
    app.run(grace_s=0.5)  # ends the backend past deadline + grace if statement_timeout did not do it
    # ended at its 300 ms deadline (+ grace), however loaded the machine: long before a 600 s sleep or the trap
    assert time.monotonic() - started < 120
    last = app.history("app.evade")[-1]
    assert last["status"] == "retrying", last
    assert last["error"]["category"] == "deadline"
    assert (last["finished_at"] - last["started_at"]).total_seconds() < 120
    # the backend is gone, not left running (a terminated backend exits asynchronously)
    wait_for(lambda: app.conn.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s AND "
                                      "state = 'active'", (app.principal,)).fetchone() == (0,),
             message="the attempt's backend to exit")


# (other roles' backend_type and query are hidden from a non-superuser; their pid and usename are not)
SIGNALS = {
    "terminate the scheduler": "PERFORM pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'postgres';",
    "cancel the scheduler": "PERFORM pg_cancel_backend(pid) FROM pg_stat_activity WHERE usename = 'postgres';",
}


@pytest.mark.parametrize("body", SIGNALS.values(), ids=SIGNALS.keys())
def test_the_principal_cannot_signal_the_schedulers_backends(app: App, body: str) -> None:
    _procedure(app, body + " CALL app.record('after');")
    name = app.job("CREATE JOB app.sig SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.p()")
    app.run()
    (h,) = app.history(name)  # written by the scheduler's own connection: it survived
    assert h["status"] == "failed"
    assert h["error"]["category"] == "security"
    assert "redacted" in h["error"]["message"]
    assert app.conn.execute("SELECT 1").fetchone() == (1,)  # the superuser session of the test too
    assert app.effects() == []


# -- from outside: roles that were not given the right ------------------------------------------------------------

def _connect_as(app: App, role: str) -> psycopg.Connection[Any]:
    return psycopg.connect(app.dsn, user=role, autocommit=True)


def _register_and_leave(app: App, node: str) -> None:
    """A node that registers, claims what is due, then dies (its control session ends)."""
    with psycopg.connect(app.dsn, autocommit=True) as session:
        session.execute("SELECT radix.register_node(%s, 'h', 1)", (node,))
        session.execute("SELECT * FROM radix.claim_due(%s, 10)", (node,))
    wait_for(lambda: app.conn.execute("SELECT radix.node_alive(%s)", (node,)).fetchone() == (False,),
             message=f"node {node} to be dead")


def _squat(attacker: psycopg.Connection[Any], node: str) -> None:
    """What a principal could try to make a node look alive: take advisory locks, re-register the node."""
    attacker.execute("SELECT pg_advisory_lock(1918986360, k) FROM generate_series(1, 50) k")
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        attacker.execute("SELECT radix.register_node(%s, 'evil', 1)", (node,))


def test_a_principal_cannot_keep_a_dead_node_alive(app: App) -> None:
    """Liveness is the node's own control backend (pid and start time), which no other session can be."""
    name = app.job("CREATE JOB app.held SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('held')")
    app.make_due(name)
    _register_and_leave(app, "dead")
    with _connect_as(app, app.principal) as attacker:
        _squat(attacker, "dead")
        app.run(node_id="survivor")
    assert [h["status"] for h in app.history(name)] == ["lease_lost", "succeeded"]


def test_a_principal_cannot_keep_a_node_from_starting(app: App) -> None:
    _register_and_leave(app, "next")

    async def start() -> None:
        engine = Engine(app.dsn, node_id="next")
        try:
            await asyncio.wait_for(engine.start(), 120)  # the squatter stays: a wait for it would never end
        finally:
            await engine.close()

    with _connect_as(app, app.principal) as attacker:
        _squat(attacker, "next")
        asyncio.run(start())


def test_a_role_cannot_hold_up_a_node_registering(app: App, roles: Any) -> None:
    """Registration serialises on a lock of the node's name; no other role may take it and make the node
    wait (the advisory key is computable by anyone: hashtext('radix.node:' || node))."""
    attacker = roles("attacker")

    async def start() -> None:
        engine = Engine(app.dsn, node_id="next")
        try:
            await asyncio.wait_for(engine.start(), 120)  # the key stays held: a wait for it would never end
        finally:
            await engine.close()

    with _connect_as(app, attacker) as conn:
        conn.execute("SELECT pg_advisory_lock(hashtext('radix.node:next'))")
        asyncio.run(start())


def test_a_role_cannot_hold_up_another_roles_document(app: App, roles: Any) -> None:
    """A document's run waits only for an earlier run of that task, never for a lock another role can take."""
    attacker = roles("attacker")
    app.conn.execute("CREATE FUNCTION public.noop() RETURNS void LANGUAGE sql AS $$ SELECT 1 $$")
    documents.apply(app.conn, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": 1, "DB_FUNCTION": "noop", "RUN_AS": app.principal, "INTERVAL": "now() + interval '1 hour'"}})

    async def run() -> None:
        async with document_engine(app.dsn, entry_points=False, db_timeout_s=3) as scheduler:
            await scheduler.run_due()

    with _connect_as(app, attacker) as conn:
        conn.execute("SELECT pg_advisory_lock(c, hashtext('1')) FROM generate_series(1918986355, 1918986365) c")
        asyncio.run(run())
    props = documents.get_document(app.conn, 1)["props"]  # type: ignore[index]
    assert (props["COUNT_ERROR"], props["ERROR_TEXT"]) == (0, None)


def test_documents_cannot_be_written_in_another_roles_name(app: App, roles: Any) -> None:
    """radix._apply_documents(creator, …) is callable by anyone: naming a role the session cannot become
    gains nothing (the same rule as _create_job)."""
    victim, attacker = roles("victim"), roles("attacker")
    app.conn.execute(sql.SQL("GRANT {} TO {} WITH SET FALSE").format(sql.Identifier(victim), sql.Identifier(attacker)))
    doc = '[{"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {"NUM": 1, "DB_FUNCTION": "f"}}]'
    with _connect_as(app, attacker) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("SELECT radix._apply_documents(%s, %s, false)", (victim, doc))
    assert app.conn.execute("SELECT count(*) FROM radix.cron_table").fetchone() == (0,)


DIRECT = {
    "insert a document": "INSERT INTO radix.cron_table (num, status, props, owner_oid, writer_oid, principal_oid) "
                         "SELECT 'x', 'CRON_TABLE_ACTIVE', '{}', oid, oid, oid FROM pg_roles "
                         "WHERE rolname = 'postgres'",
    "update documents": "UPDATE radix.cron_table SET principal_oid = 10",
    "insert a process": "INSERT INTO radix.sys_processes (task_num, doc_version, type, target, started_at, node) "
                        "VALUES ('7', 1, 'db', 'x', now(), 'n')",
    "read processes": "SELECT * FROM radix.sys_processes",
    "insert a node": "INSERT INTO radix.nodes (node_id) VALUES ('evil')",
    "read frames": "SELECT lease_token FROM radix.attempt_frames",
    "insert an idempotency key": "INSERT INTO radix.idempotency_keys VALUES ('k', gen_random_uuid())",
    "claim_due": "SELECT * FROM radix.claim_due('evil', 10)",
    "doc_candidates": "SELECT * FROM radix.doc_candidates(NULL, 'evil', '{}')",
    "doc_start": "SELECT * FROM radix.doc_start('7', NULL, 'evil', NULL)",
}


@pytest.mark.parametrize("statement", DIRECT.values(), ids=DIRECT.keys())
def test_direct_ledger_access_by_an_ordinary_role_is_refused(ledger: App, roles: Any, statement: str) -> None:
    outsider = roles("outsider")
    before = _ledger(ledger)
    with _connect_as(ledger, outsider) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement.encode())
    assert _ledger(ledger) == before


# -- CSP services named by a document ------------------------------------------------------------------------------

async def _run_documents(dsn: str) -> None:
    async with document_engine(dsn, services={"known": "json:dumps"}, entry_points=False) as scheduler:
        await scheduler.run_due()


@pytest.mark.parametrize("service", ["os:system", "subprocess:getoutput", "builtins:exec", "not_registered",
                                     "tests.security.test_escapes:_connect_as", "known "])
def test_a_document_cannot_name_code_to_run(app: App, tmp_path: Path, service: str) -> None:
    marker = tmp_path / f"pwned-{uuid.uuid4().hex}"
    documents.apply(app.conn, {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": 1, "CSP_SERVICE": service, "CSP_SERVICE_PARAMS": f'"touch {marker}"', "RUN_AS": app.principal}})
    asyncio.run(_run_documents(app.dsn))
    doc = documents.get_document(app.conn, 1)
    assert doc is not None
    # applied by a superuser, so admitted: the scheduler still runs only registered names, and lists none
    assert doc["props"]["ERROR_TEXT"].startswith(f"CSP service {service!r} is not registered with this scheduler")
    assert "known" not in doc["props"]["ERROR_TEXT"].removeprefix(f"CSP service {service!r}")
    assert not marker.exists()
