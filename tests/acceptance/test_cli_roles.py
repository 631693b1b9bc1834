"""Every LOGIN role uses the CLI within its rights; operators (radix_admin, the scheduler role) see all.

Each command runs as a subprocess with ``--dsn`` logged in as a non-superuser role: a job's owner, a
document's author, a stranger, a member of radix_admin, and a scheduler role that owns schema radix.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from radixjobs import migrate
from tests.acceptance.conftest import run_cli
from tests.support import PgCluster

NO_DAEMON = "127.0.0.1:9"  # `status` falls back to the database when no daemon answers here


class As:
    """Run radixjobs in one database as one role."""

    def __init__(self, pg: PgCluster, dbname: str, user: str | None) -> None:
        self.dsn = pg.dsn_for(dbname, user=user)

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, "--dsn", self.dsn)

    def ok(self, *args: str) -> str:
        done = self(*args)
        assert done.returncode == 0, done.stderr
        assert "Traceback" not in done.stderr
        return done.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json"))


@pytest.fixture
def dbname(db: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(db)["dbname"])


@pytest.fixture
def tenants(pg: PgCluster, db: str, dbname: str, conn: psycopg.Connection[Any], roles: Any,
            tmp_path: Path) -> dict[str, Any]:
    """An owner with one run job, an author with one document, a stranger: all LOGIN, none superuser."""
    owner, author, stranger = roles("owner"), roles("author"), roles("stranger")
    for role in (owner, author):
        conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(role), sql.Identifier(role)))
    script = tmp_path / "owner.sql"
    script.write_text(f"""
        CREATE TABLE {owner}.runs (at timestamptz DEFAULT clock_timestamp());
        CREATE PROCEDURE {owner}.tick() LANGUAGE sql AS 'INSERT INTO {owner}.runs DEFAULT VALUES';
        CREATE JOB {owner}.once SCHEDULE AT TIMESTAMP '2020-01-01T00:00:00Z' RUN AS {owner} CALL {owner}.tick();
    """)
    as_owner = As(pg, dbname, owner)
    assert "CREATE JOB" in as_owner.ok("sql", "-f", str(script))
    assert json.loads(run_cli("run", "--once", "--json", "--dsn", db).stdout)["attempts"] == 1
    as_author = As(pg, dbname, author)
    as_author.ok("sql", "-c", f"CREATE FUNCTION {author}.archive() RETURNS void LANGUAGE sql AS 'SELECT 1'")
    doc = tmp_path / "doc.json"
    doc.write_text(json.dumps({"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE",
                               "props": {"NUM": 4242, "DB_FUNCTION": f"{author}.archive",
                                         "INTERVAL": "NOW() + INTERVAL '1 hour'"}}))
    return {"owner": owner, "author": author, "stranger": stranger, "doc": doc,
            "job": f"{owner}.once", "as": lambda user: As(pg, dbname, user)}


def names(listed: list[dict[str, Any]]) -> set[str]:
    return {row["name"] for row in listed}


def test_the_owner_lists_shows_and_reads_the_history_of_its_job(tenants: dict[str, Any]) -> None:
    owner = tenants["as"](tenants["owner"])
    job = tenants["job"]
    assert names(owner.json("jobs", "list")) == {job}
    assert owner.json("jobs", "show", job)["principal"] == tenants["owner"]
    (attempt,) = owner.json("jobs", "history", job)
    assert attempt["status"] == "succeeded"
    human = owner.ok("jobs", "history", job)
    header = human.splitlines()[0].split("|")
    assert [h.strip() for h in header] == ["status", "run", "planned_at", "started_at", "duration", "attempt",
                                           "category", "message"]
    assert "succeeded" in human
    assert ("ms" in human or " s" in human)
    assert owner.json("status", "--http", NO_DAEMON)["jobs_by_status"] == {"complete": 1}


def test_the_author_applies_and_lists_its_document(tenants: dict[str, Any]) -> None:
    author = tenants["as"](tenants["author"])
    assert "created" in author.ok("docs", "apply", str(tenants["doc"]))
    assert [d["props"]["NUM"] for d in author.json("docs", "list")] == [4242]
    assert names(author.json("jobs", "list")) == {"doc:4242"}


def test_a_stranger_sees_nothing(tenants: dict[str, Any]) -> None:
    tenants["as"](tenants["author"]).ok("docs", "apply", str(tenants["doc"]))
    stranger = tenants["as"](tenants["stranger"])
    assert stranger.json("jobs", "list") == []
    assert stranger.json("docs", "list") == []
    for args in (("jobs", "show", tenants["job"]), ("jobs", "history", tenants["job"])):
        refused = stranger(*args)
        assert refused.returncode == 1
        assert "does not exist (or is not visible to this role)" in refused.stderr
    assert stranger.json("sql", "-c", "SELECT count(*) AS n FROM radix.node_overview") == [{"n": 0}]
    refused = stranger("install")
    assert refused.returncode == 1
    assert f"role '{tenants['stranger']}' may not install or upgrade radixjobs" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_a_radix_admin_member_sees_everything_and_changes_nothing(
        tenants: dict[str, Any], roles: Any, conn: psycopg.Connection[Any]) -> None:
    tenants["as"](tenants["author"]).ok("docs", "apply", str(tenants["doc"]))
    admin = roles("admin")
    conn.execute(sql.SQL("GRANT radix_admin TO {}").format(sql.Identifier(admin)))
    as_admin = tenants["as"](admin)
    assert names(as_admin.json("jobs", "list")) == {tenants["job"], "doc:4242"}
    assert [d["props"]["NUM"] for d in as_admin.json("docs", "list")] == [4242]
    (attempt,) = as_admin.json("jobs", "history", tenants["job"], "--status", "succeeded")
    assert attempt["status"] == "succeeded"
    assert as_admin.json("jobs", "show", tenants["job"])["owner"] == tenants["owner"]
    assert as_admin.json("status", "--http", NO_DAEMON)["jobs_by_status"] == {"complete": 1}
    # read-only: acting on a job still needs its owner's privileges
    refused = as_admin("sql", "-c", f"DROP JOB {tenants['job']}")
    assert refused.returncode == 1
    assert "must be owner of job" in refused.stderr
    assert as_admin.json("sql", "-c", "SELECT count(*) AS n FROM radix.job_history") == [{"n": 1}]


def test_the_scheduler_role_owning_radix_sees_everything(pg: PgCluster, roles: Any, tmp_path: Path) -> None:
    """A non-superuser scheduler role installs radix in its own database and sees every tenant's job."""
    scheduler, tenant = roles("sched"), roles("tenant")
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(name), sql.Identifier(scheduler)))
    try:
        as_scheduler, as_tenant = As(pg, name, scheduler), As(pg, name, tenant)
        as_scheduler.ok("install")
        with psycopg.connect(pg.dsn_for(name), autocommit=True) as c:
            assert c.execute("SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'radix'"
                             ).fetchone() == (scheduler,)
            c.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(tenant),
                                                                          sql.Identifier(tenant)))
        as_tenant.ok("sql", "-c", f"CREATE PROCEDURE {tenant}.p() LANGUAGE sql AS 'SELECT 1'; "
                                  f"CREATE JOB {tenant}.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS {tenant} "
                                  f"CALL {tenant}.p()")
        assert names(as_scheduler.json("jobs", "list")) == {f"{tenant}.j"}
        assert names(as_tenant.json("jobs", "list")) == {f"{tenant}.j"}
        assert as_scheduler.json("jobs", "history", f"{tenant}.j") == []
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def bare_db(pg: PgCluster) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield name
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def test_a_database_without_radix_says_so_to_any_role(pg: PgCluster, bare_db: str, roles: Any) -> None:
    done = As(pg, bare_db, roles("someone"))("jobs", "list")
    assert done.returncode == 1
    assert "radixjobs is not installed in database" in done.stderr
    assert "Traceback" not in done.stderr


def test_history_reads_as_a_table_and_filters(tenants: dict[str, Any], conn: psycopg.Connection[Any]) -> None:
    """Status, times, a duration with its unit, the error's category and the first line of its message
    (wrapped, at most 5 lines);
    --status, --since and --limit filter; bad values are one-line errors."""
    long = "deadlock between the archiver and " + "x" * 300 + "\nCONTEXT: second line"
    conn.execute(
        "INSERT INTO radix.radix_system_job_history (job_id, definition_version, planned_ns, attempt, "
        "idempotency_key, status, started_at, finished_at, error) "
        "SELECT job_id, 1, radix.to_ns(now() - a.ago), a.n, 'k' || a.n, a.status, now() - a.ago, "
        "now() - a.ago + a.took, a.error "
        "FROM radix.job_overview, (VALUES (1, 'failed', interval '2 hours', interval '1.5 seconds', "
        "jsonb_build_object('category', 'data', 'kind', 'division_by_zero', 'message', %s::text)), "
        "(2, 'retrying', interval '10 minutes', interval '340 milliseconds', "
        "jsonb_build_object('category', 'transient', 'message', 'lock timeout'))) "
        "AS a(n, status, ago, took, error) WHERE name = %s", (long, tenants["job"]))
    owner, job = tenants["as"](tenants["owner"]), tenants["job"]

    human = owner.ok("jobs", "history", job)
    assert "1.5 s" in human
    assert "340 ms" in human
    assert "data" in human
    assert "transient" in human
    assert "lock timeout" in human
    assert "…" in human
    assert "CONTEXT" not in human
    assert '{"' not in human
    assert max(len(line) for line in human.splitlines()) < 200
    assert "(3 rows)" in human

    full = owner.json("jobs", "history", job, "--status", "failed")
    assert [(r["status"], r["error"]["message"]) for r in full] == [("failed", long)]
    assert {r["status"] for r in owner.json("jobs", "history", job, "--status", "failed",
                                            "--status", "retrying")} == {"failed", "retrying"}
    assert {r["status"] for r in owner.json("jobs", "history", job, "--since", "1 hour")} == {"retrying",
                                                                                        "succeeded"}
    assert len(owner.json("jobs", "history", job, "--since", "2020-01-01T00:00:00Z")) == 3
    assert len(owner.json("jobs", "history", job, "--since", "2020-01-01 00:00")) == 3
    assert len(owner.json("jobs", "history", job, "--limit", "1")) == 1

    for bad, where in ((("--since", "yesterdayish"), "--since"), (("--status", "nope"), "--status"),
                       (("--limit", "0"), "--limit")):
        refused = owner("jobs", "history", job, *bad)
        assert refused.returncode != 0
        assert where in refused.stderr
        assert "Traceback" not in refused.stderr
        assert len([line for line in refused.stderr.splitlines() if line.strip()]) <= 3  # click's usage + error


def test_a_schema_older_than_the_version_function_says_so_to_any_role(
        pg: PgCluster, db: str, dbname: str, conn: psycopg.Connection[Any], roles: Any) -> None:
    """Without radix.schema_version() only the ledger holds the version, and only its owner reads it: another
    role is told the schema is older than this radixjobs needs (not `permission denied`)."""
    conn.execute("DROP FUNCTION radix.schema_version() CASCADE")
    conn.execute("DELETE FROM radix.schema_migrations WHERE version >= %s", (migrate.code_version(),))
    done = As(pg, dbname, roles("someone"))("jobs", "list")
    assert done.returncode == 1
    assert "is at an older version, this radixjobs needs" in done.stderr
    assert "Traceback" not in done.stderr
    owner = run_cli("jobs", "list", "--dsn", db)
    assert f"is at version {migrate.code_version() - 1}, this radixjobs needs" in owner.stderr


def test_an_installer_that_may_not_create_roles_leaves_radix_admin_to_the_operator(
        pg: PgCluster, roles: Any) -> None:
    """No CREATEROLE: the install goes on with a NOTICE; radix_admin created later counts at once."""
    installer, member, tenant = roles("installer"), roles("member"), roles("tenant")
    name = f"t_{uuid.uuid4().hex[:12]}"
    ident = sql.Identifier
    with psycopg.connect(pg.dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(ident(name), ident(installer)))
        c.execute("DROP ROLE IF EXISTS radix_admin")  # cluster-wide: recreated below whatever happens
    try:
        notices: list[str] = []
        with psycopg.connect(pg.dsn_for(name, user=installer), autocommit=True) as c:
            c.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
            migrate.install(c)
        assert any("role radix_admin was not created" in n and "CREATE ROLE radix_admin NOLOGIN" in n
                   for n in notices), notices
        with psycopg.connect(pg.dsn_for(name), autocommit=True) as c:
            assert c.execute("SELECT count(*) FROM pg_roles WHERE rolname = 'radix_admin'").fetchone() == (0,)
            c.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(ident(tenant), ident(tenant)))
            c.execute("CREATE ROLE radix_admin NOLOGIN")
            c.execute(sql.SQL("GRANT radix_admin TO {}").format(ident(member)))
        As(pg, name, tenant).ok("sql", "-c", f"CREATE PROCEDURE {tenant}.p() LANGUAGE sql AS 'SELECT 1'; "
                                             f"CREATE JOB {tenant}.j SCHEDULE EVERY INTERVAL '1 hour' "
                                             f"RUN AS {tenant} CALL {tenant}.p()")
        assert names(As(pg, name, member).json("jobs", "list")) == {f"{tenant}.j"}
    finally:
        with psycopg.connect(pg.dsn, autocommit=True) as c:
            c.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(ident(name)))
            c.execute("DO $$ BEGIN CREATE ROLE radix_admin NOLOGIN; EXCEPTION WHEN duplicate_object THEN END $$")
