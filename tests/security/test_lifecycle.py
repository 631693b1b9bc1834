"""Attacks on the lifecycle verbs (sql/routines/jobs.sql, requests.sql): RUN JOB, backfill and ALTER JOB ... SET
by roles that may not, queue floods, forged ticks, and the scheduler-only state (requests, the fence). Each goes
through the real path: a LOGIN role's own connection calling the public SQL functions or the DDL."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import errors, sql

from radixjobs import catalog
from radixjobs.errors import AdmissionError
from tests.apps import App

HOURLY = "SCHEDULE EVERY INTERVAL '1 hour' STARTING AT TIMESTAMP '2026-01-01T00:00:00Z'"


def _grant(app: App, text: str, *roles: str) -> None:
    app.conn.execute(sql.SQL(text).format(*(sql.Identifier(r) for r in roles)))


def _owned_job(app: App, roles: Any, login: Any) -> tuple[str, psycopg.Connection[Any]]:
    """A job owned by a tenant (an ordinary role), run as the app's principal; the tenant's connection."""
    tenant = roles("tenant")
    _grant(app, "GRANT USAGE, CREATE ON SCHEMA app TO {0}; GRANT {1} TO {0}", tenant, app.principal)
    conn = login(tenant)
    catalog.execute_job_ddl(conn, f"CREATE JOB app.owned {HOURLY} RUN AS {app.principal} CALL app.record('t')")
    return tenant, conn


def _requests(app: App) -> int:
    row = app.conn.execute("SELECT count(*) FROM radix.job_requests").fetchone()
    return int(row[0]) if row else -1


def test_a_stranger_cannot_run_backfill_or_change_a_job(app: App, roles: Any, login: Any) -> None:
    owner, _ = _owned_job(app, roles, login)
    stranger = roles("stranger")
    _grant(app, "GRANT USAGE, CREATE ON SCHEMA app TO {}", stranger)
    conn = login(stranger)
    for ddl in ("RUN JOB app.owned", "RUN JOB app.owned FOR RANGE TIMESTAMP '2026-01-02' TO TIMESTAMP '2026-01-03'",
                "ALTER JOB app.owned SET (history = 1)", f"ALTER JOB app.owned SET RUN AS {stranger}",
                "ALTER JOB app.owned RENAME TO app.mine",
                f"CREATE OR REPLACE JOB app.owned {HOURLY} RUN AS {stranger} CALL app.record('x')"):
        # (CREATE OR REPLACE of a job it does not see is a CREATE JOB: "already exists", as CREATE on the
        # schema lets it learn anyway)
        with pytest.raises(AdmissionError, match=r"must be owner|does not exist|already exists"):
            catalog.execute_job_ddl(conn, ddl)
    with pytest.raises(errors.InsufficientPrivilege):  # the internal function, naming the owner as caller
        conn.execute("SELECT radix._request_ticks(%s, 'app.owned', ARRAY[1]::bigint[], 'run')", (owner,))
    job = catalog.get_job(app.conn, "app.owned")
    assert job is not None
    assert (job["definition_version"], job["history_limit"], _requests(app)) == (1, 256, 0)


def test_a_member_cannot_move_a_job_to_a_principal_its_owner_may_not_use(app: App, roles: Any, login: Any) -> None:
    """bob has alice's privileges and SET on a powerful role; alice does not: her job must not run as it."""
    alice, _ = _owned_job(app, roles, login)
    bob = roles("bob")
    powerful = roles("powerful")
    _grant(app, "GRANT {0} TO {1}; GRANT {2} TO {1}; GRANT USAGE, CREATE ON SCHEMA app TO {1}", alice, bob, powerful)
    with pytest.raises(AdmissionError, match="permission denied to schedule a job as role"):
        catalog.execute_job_ddl(login(bob), f"ALTER JOB app.owned SET RUN AS {powerful}")
    job = catalog.get_job(app.conn, "app.owned")
    assert job is not None
    assert job["principal"] == app.principal


def test_the_queue_of_a_job_is_bounded(app: App, roles: Any, login: Any) -> None:
    _, conn = _owned_job(app, roles, login)
    catalog.execute_job_ddl(conn, "ALTER JOB app.owned SET SCHEDULE EVERY INTERVAL '1 second' STARTING AT "
                                  "TIMESTAMP '2026-01-01T00:00:00Z'")
    start = 1767225600 * 10**9  # 2026-01-01T00:00:00Z; ticks at k >= 0 seconds after it
    with pytest.raises(AdmissionError, match="above the limit of 10000 per statement"):
        catalog.backfill_job(conn, "app.owned", start, start + 10_001 * 10**9)
    assert _requests(app) == 0
    assert catalog.backfill_job(conn, "app.owned", start, start + 10_000 * 10**9) == 10_000
    assert _requests(app) == 10_000 - 1  # the oldest is the job's current tick
    catalog.run_job(conn, "app.owned")  # the 10,000th queued
    with pytest.raises(AdmissionError, match="too many queued runs"):
        catalog.run_job(conn, "app.owned")
    with pytest.raises(AdmissionError, match="too many queued runs"):
        catalog.backfill_job(conn, "app.owned", start + 20_000 * 10**9, start + 20_003 * 10**9)
    assert _requests(app) == 10_000


def test_forged_ticks_are_refused(app: App, roles: Any, login: Any) -> None:
    _, conn = _owned_job(app, roles, login)
    with pytest.raises(errors.InvalidParameterValue, match="only for a CRON job"):
        conn.execute("SELECT radix.backfill_job('app.owned', '2026-01-02', '2026-01-03', ARRAY[42]::bigint[])")
    catalog.execute_job_ddl(conn, f"CREATE JOB app.cron SCHEDULE CRON '0 * * * *' RUN AS {app.principal} "
                                  "CALL app.record('c')")
    with pytest.raises(errors.InvalidParameterValue, match="outside the range"):
        conn.execute("SELECT radix.backfill_job('app.cron', '2026-01-02', '2026-01-03', ARRAY[42]::bigint[])")
    assert _requests(app) == 0


def test_the_scheduler_state_stays_the_schedulers(app: App, roles: Any, login: Any) -> None:
    """A tenant can read neither the queue nor the ledger, nor clear a fence or install a request itself."""
    _, conn = _owned_job(app, roles, login)
    for statement in ("SELECT * FROM radix.job_requests", "SELECT * FROM radix.backfill_done",
                      "INSERT INTO radix.job_requests (job_id, planned_ns, kind, requested_by) "
                      "SELECT job_id, 1, 'run', current_user FROM radix.job_overview",
                      "SELECT radix.finish_attempt(gen_random_uuid(), gen_random_uuid(), 'failed', NULL, 0, NULL, "
                      "false, false)",
                      "SELECT radix._promote_request(gen_random_uuid())"):
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(statement.encode())


def test_a_stranger_learns_neither_a_job_s_existence_nor_its_anchor(app: App, roles: Any, login: Any) -> None:
    """The helpers of CREATE OR REPLACE and of backfill answer as the caller, not as their definer."""
    owner, owner_conn = _owned_job(app, roles, login)
    job_id = app.state("app.owned")["job_id"]
    stranger = login(roles("stranger"))
    # existence: the stranger's answer is the one for a name that does not exist; the owner's is true
    for name in ("app.owned", "app.nothing_here"):
        assert stranger.execute("SELECT radix._job_exists(%s)", (name,)).fetchone() == (False,)
    assert owner_conn.execute("SELECT radix._job_exists('app.owned')").fetchone() == (True,)
    # the anchor: the public function is gone; its replacement checks the caller's right to change the job
    with pytest.raises(errors.UndefinedFunction):
        stranger.execute("SELECT radix.job_anchor_ns(%s)", (job_id,))
    for caller in (owner, stranger.info.user):  # naming the owner as caller is refused as well
        with pytest.raises(errors.InsufficientPrivilege):
            stranger.execute("SELECT radix._job_anchor_ns(%s, 'app.owned')", (caller,))
    anchor = owner_conn.execute("SELECT radix._job_anchor_ns(current_user, 'app.owned')").fetchone()
    assert anchor is not None
    assert anchor == app.conn.execute("SELECT anchor_ns FROM radix.radix_system_job_state WHERE job_id = %s",
                                      (job_id,)).fetchone()
    # and backfill, which reads it, still works for the owner
    catalog.execute_job_ddl(owner_conn, "RUN JOB app.owned FOR RANGE TIMESTAMP '2026-01-01T00:30:00Z' "
                                        "TO TIMESTAMP '2026-01-01T03:00:00Z'")
    assert _requests(app) >= 1


# -- pg_cron import -------------------------------------------------------------------------------------

FAKE_CRON = (b"CREATE SCHEMA cron; CREATE TABLE cron.job (jobid bigserial PRIMARY KEY, schedule text, command text, "
             b"nodename text DEFAULT 'localhost', nodeport int DEFAULT current_setting('port')::int, "
             b"database text DEFAULT current_database(), username text, active boolean DEFAULT true, jobname text)")


def test_a_planted_cron_table_is_not_imported(app: App, roles: Any, login: Any) -> None:
    """A role that may create schemas plants cron.job with a row RUN AS the superuser; the operator's import
    (as a superuser, who may act as anyone) refuses the table instead of scheduling the row."""
    from radixjobs.errors import RadixError
    from radixjobs.imports import import_pg_cron

    hostile = roles("hostile")
    dbname = app.conn.execute("SELECT current_database()").fetchone()
    assert dbname is not None
    _grant(app, "GRANT CREATE ON DATABASE {} TO {}", dbname[0], hostile)
    planter = login(hostile)
    planter.execute(FAKE_CRON)
    planter.execute("INSERT INTO cron.job (schedule, command, username) VALUES ('* * * * *', %s, current_user)",
                    (f"ALTER ROLE {hostile} SUPERUSER",))
    superuser = app.conn.execute("SELECT current_user").fetchone()
    assert superuser is not None
    planter.execute("UPDATE cron.job SET username = %s", (superuser[0],))
    with pytest.raises(RadixError, match=r"owned by role .*neither a superuser nor you"):
        import_pg_cron(app.conn, schema="cron_import")
    # a table the operator owns but that others may write is refused too
    app.conn.execute(b"DROP SCHEMA cron CASCADE")
    app.conn.execute(FAKE_CRON)
    _grant(app, "GRANT USAGE ON SCHEMA cron TO {0}; GRANT INSERT ON cron.job TO {0}", hostile)
    with pytest.raises(RadixError, match="can be written directly by"):
        import_pg_cron(app.conn, schema="cron_import")
    assert app.conn.execute("SELECT count(*) FROM radix.job_overview").fetchone() == (0,)
    assert app.conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (hostile,)).fetchone() == (False,)
