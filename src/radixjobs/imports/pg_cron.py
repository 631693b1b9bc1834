"""Import pg_cron's jobs (``cron.job``) as radixjobs jobs, each admitted as its pg_cron user's own CREATE JOB.

Invariants:

- Reading ``cron.job``, the trust checks and planning run on the importer's connection; each job and its
  wrapper are created on a session logged in as the row's ``username`` (pg_cron_session.py), so the job's
  owner, its principal and the wrapper's owner are that user, and admission runs with that user's rights.
  A user the importer cannot log in as is "unmapped", with the reason.
- The schema is the importer's: created (owned by the importer) when missing, refused as a whole when
  another role owns it. Each user whose job is created gets USAGE on it (kept: its job CALLs its wrapper
  there) and CREATE for the import only (revoked at the end when the import granted it), committed before
  the user's session looks.
- Each job is one transaction on its user's session: a refusal rolls the wrapper and the job back together.
- A dry run writes nothing: no schema, no grant; each job is admitted and rolled back, in the user's
  temporary schema when the real one is not ready for that user yet.
- A job whose name already exists, run as the row's user, is left alone ("exists"), so importing twice
  creates nothing twice; one run as another role is a refusal naming it.
- Rows for another database or another node are skipped, never retargeted silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from radixjobs.errors import RadixError
from radixjobs.imports.pg_cron_plan import (
    Action,
    CronJobRow,
    JobPlan,
    Outcome,
    Unmappable,
    job_names,
    map_command,
    map_schedule,
)
from radixjobs.imports.pg_cron_session import LoginFailed, Sessions, admit, existing
from radixjobs.model import QualifiedName

__all__ = ["Outcome", "failed", "import_pg_cron", "plan", "read_cron_jobs"]

Conn = psycopg.Connection[Any]
DEFAULT_SCHEMA = "cron_import"  # (a schema name may not begin with pg_)
LOCAL_NODES = frozenset({"", "localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class Source:
    """Where the pg_cron rows came from: the rows, the server's port and pg_cron's time zone."""

    rows: tuple[CronJobRow, ...]
    port: int
    time_zone: str


def read_cron_jobs(conn: Conn) -> Source:
    """``cron.job`` as rows (those the role may see: pg_cron's row security shows a role its own);
    RadixError when this database has no pg_cron tables."""
    with conn.transaction():
        found = conn.execute("SELECT pg_catalog.to_regclass('cron.job'::pg_catalog.text) IS NOT NULL, "
                             "pg_catalog.current_database(), "
                             "pg_catalog.current_setting('port'::pg_catalog.text)::pg_catalog.int4, "
                             "pg_catalog.current_setting('cron.timezone'::pg_catalog.text, true)").fetchone()
        assert found is not None
        present, database, port, zone = found
        if not present:
            raise RadixError(f"no pg_cron here: database {database} has no table cron.job (pg_cron keeps its "
                             "jobs in the database named by its cron.database_name setting; connect to that "
                             "one, or pass --cron-dsn)")
        _check_trusted(conn)
        records = conn.execute("SELECT pg_catalog.to_jsonb(j) FROM cron.job j ORDER BY j.jobid").fetchall()
    rows = tuple(CronJobRow.from_record(rec) for (rec,) in records)
    return Source(rows, int(port), _zone(zone))


# Who may have written cron.job's rows directly: its owner and the roles holding INSERT or UPDATE on it.
WRITERS = """
SELECT r.rolname, r.rolsuper OR r.rolname OPERATOR(pg_catalog.=) CURRENT_USER,
       ARRAY(SELECT CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                         ELSE pg_catalog.pg_get_userbyid(a.grantee) END
             FROM pg_catalog.aclexplode(c.relacl) a
             LEFT JOIN pg_catalog.pg_roles g ON g.oid OPERATOR(pg_catalog.=) a.grantee
             WHERE a.privilege_type OPERATOR(pg_catalog.=) ANY (ARRAY['INSERT', 'UPDATE']::pg_catalog.text[])
               AND a.grantee OPERATOR(pg_catalog.<>) c.relowner AND NOT coalesce(g.rolsuper, false))
FROM pg_catalog.pg_class c, pg_catalog.pg_roles r
WHERE c.oid OPERATOR(pg_catalog.=) 'cron.job'::pg_catalog.regclass
  AND r.rolname OPERATOR(pg_catalog.=) pg_catalog.pg_get_userbyid(c.relowner)
"""


def _check_trusted(conn: Conn) -> None:
    """Refuse a cron.job that another role could have written: each row's username becomes a job's RUN AS,
    which pg_cron itself guarantees only for its own table (owned by a superuser, written through its
    functions). The table's owner must be a superuser or this role, and no other role may write it."""
    row = conn.execute(WRITERS).fetchone()
    assert row is not None
    owner, trusted_owner, writers = row
    if not trusted_owner:
        raise RadixError(f"cron.job is owned by role {owner}, neither a superuser nor you: its rows (and the roles "
                         "they run as) could have been written by that role; refusing to import them")
    if writers:
        raise RadixError(f"cron.job can be written directly by {', '.join(writers)}: its rows (and the roles they "
                         "run as) could have been forged; refusing to import them (REVOKE INSERT, UPDATE ON "
                         "cron.job FROM …)")


def _zone(setting: str | None) -> str:
    """pg_cron's cron.timezone (GMT unless set; UTC spelled the IANA way)."""
    if not setting or setting.upper() in ("GMT", "UTC", "ETC/UTC", "Z"):
        return "UTC"
    return setting


def plan(row: CronJobRow, name: QualifiedName, *, database: str, port: int, time_zone: str) -> JobPlan | Outcome:
    """The job for one row, or why the row is skipped or unmapped."""

    def outcome(action: Action, reason: str) -> Outcome:
        return Outcome(row.jobid, row.jobname, str(name), action, reason)

    if (row.database or database) != database:
        return outcome("skipped", f"runs in database {row.database}: connect to it, or pass --database "
                                  f"{row.database} to import it here")
    node = row.nodename or ""
    if not (node in LOCAL_NODES or node.startswith("/")) or (row.nodeport not in (None, port)):
        return outcome("skipped", f"runs on node {row.nodename}:{row.nodeport}, not on this server")
    if not row.username:
        return outcome("unmapped", "the pg_cron job has no username to RUN AS")
    try:
        schedule = map_schedule(row.schedule, time_zone)
        command = map_command(row.command)
    except Unmappable as exc:
        return outcome("unmapped", str(exc))
    return JobPlan(row, name, schedule, row.username, command)


def import_pg_cron(conn: Conn, *, schema: str = DEFAULT_SCHEMA, database: str | None = None,
                   dry_run: bool = False, source: Conn | None = None, timeout_ms: int | None = None,
                   dsn: str | None = None) -> list[Outcome]:
    """Import every visible ``cron.job`` row into ``schema`` of the connected database, job by job.

    ``database``: import the rows of this pg_cron database (default: the connected one). ``source``: read
    ``cron.job`` there (default: ``conn``). ``timeout_ms``: each job's timeout (default: radixjobs').
    ``dsn``: where the users' sessions log in (default: ``conn``'s parameters; its password is never used).
    """
    if not conn.autocommit:
        raise RadixError("the import needs an autocommit connection: the schema and grants commit before the "
                         "users' sessions look, and each job is its own transaction")
    src = read_cron_jobs(source or conn)
    if database is None:
        row = conn.execute("SELECT pg_catalog.current_database()::pg_catalog.text").fetchone()
        assert row is not None
        database = str(row[0])
    names = job_names(src.rows)
    results: dict[int, Outcome | JobPlan] = {
        row.jobid: plan(row, QualifiedName(schema, names[row.jobid]), database=database, port=src.port,
                        time_zone=src.time_zone)
        for row in src.rows}
    for job in _planned(results):
        results[job.row.jobid] = existing(conn, job) or job
    if _planned(results):
        _create_all(conn, _planned(results), results, schema=schema, dry_run=dry_run, timeout_ms=timeout_ms,
                    dsn=dsn or conn.info.dsn)
    return _outcomes(results)


def _create_all(conn: Conn, jobs: list[JobPlan], results: dict[int, Outcome | JobPlan], *, schema: str,
                dry_run: bool, timeout_ms: int | None, dsn: str) -> None:
    """Log in as each job's user, make the schema ready (not in a dry run), then admit each job."""
    exists = _schema_is_yours(conn, schema)
    jobs = sorted(jobs, key=lambda j: (j.principal, j.row.jobid))  # user by user: one session at a time
    with Sessions(conn, dsn) as sessions:
        users: set[str] = set()
        for job in jobs:
            try:
                sessions.get(job.principal)
                users.add(job.principal)
            except LoginFailed as exc:
                results[job.row.jobid] = job.outcome("unmapped", str(exc))
        if not users:
            return
        granted = Granted((), ())
        if not dry_run:
            if not exists:
                _create_schema(conn, schema)
            granted = _grant(conn, schema, sorted(users))
        creators: set[str] = set()
        try:
            # a dry run admits in the real schema only where the user may already create; an import always
            ready = {user: not dry_run or (exists and _may_create(conn, schema, user)) for user in users}
            for job in jobs:
                if job.principal not in users:
                    continue
                outcome = _create(conn, sessions, job, ready=ready[job.principal], dry_run=dry_run,
                                  timeout_ms=timeout_ms)
                results[job.row.jobid] = outcome
                if outcome.action == "created":
                    creators.add(job.principal)
        finally:
            _revoke(conn, schema, granted, creators)


def _planned(results: dict[int, Outcome | JobPlan]) -> list[JobPlan]:
    return [p for p in results.values() if isinstance(p, JobPlan)]


def _outcomes(results: dict[int, Outcome | JobPlan]) -> list[Outcome]:
    out = [r for r in results.values() if isinstance(r, Outcome)]
    assert len(out) == len(results)
    return out


def _schema_is_yours(conn: Conn, schema: str) -> bool:
    """True when ``schema`` exists, False when it is missing; RadixError when another role owns it (it
    could hold objects the import would meet: a procedure named like a wrapper)."""
    row = conn.execute("SELECT pg_catalog.pg_get_userbyid(n.nspowner)::pg_catalog.text, "
                       "n.nspowner OPERATOR(pg_catalog.=) (SELECT r.oid FROM pg_catalog.pg_roles r "
                       "WHERE r.rolname OPERATOR(pg_catalog.=) CURRENT_USER) "
                       "FROM pg_catalog.pg_namespace n WHERE n.nspname OPERATOR(pg_catalog.=) %s::pg_catalog.name",
                       (schema,)).fetchone()
    if row is None:
        return False
    owner, yours = row
    if not yours:
        raise RadixError(f"schema {schema} exists and is owned by role {owner}, not by you: the import creates "
                         "its jobs and wrappers only in a schema it made or you own, so that no other role's "
                         "objects are in the way; pass another --schema (or, once you trust what is in it, "
                         "ALTER SCHEMA … OWNER TO you)")
    return True


def _create_schema(conn: Conn, schema: str) -> None:
    try:
        with conn.transaction():
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    except psycopg.Error as exc:
        if conn.broken:
            raise
        raise RadixError(f"cannot create schema {schema}: {_message(exc)}") from None


PRIVILEGES = ("SELECT pg_catalog.has_schema_privilege(%s::pg_catalog.text, %s::pg_catalog.text, "
              "'USAGE'::pg_catalog.text), pg_catalog.has_schema_privilege(%s::pg_catalog.text, "
              "%s::pg_catalog.text, 'CREATE'::pg_catalog.text)")


def _may_create(conn: Conn, schema: str, user: str) -> bool:
    """May ``user`` create its wrapper and its job in ``schema``, and call them (USAGE and CREATE)?"""
    row = conn.execute(PRIVILEGES, (user, schema, user, schema)).fetchone()
    return bool(row and row[0] and row[1])


@dataclass(frozen=True)
class Granted:
    """The privileges on the schema this import granted (and so may take back)."""

    usage: tuple[str, ...]
    create: tuple[str, ...]


def _grant(conn: Conn, schema: str, users: Sequence[str]) -> Granted:
    """USAGE and CREATE on ``schema`` to each user lacking them, committed before the users' sessions look."""
    usage, create = [], []
    target = sql.Identifier(schema)
    with conn.transaction():
        for user in users:
            row = conn.execute(PRIVILEGES, (user, schema, user, schema)).fetchone()
            assert row is not None
            if not row[0]:
                conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(target, sql.Identifier(user)))
                usage.append(user)
            if not row[1]:
                conn.execute(sql.SQL("GRANT CREATE ON SCHEMA {} TO {}").format(target, sql.Identifier(user)))
                create.append(user)
    return Granted(tuple(usage), tuple(create))


def _revoke(conn: Conn, schema: str, granted: Granted, creators: set[str]) -> None:
    """Take back what the import granted, except USAGE from the users it created a job for: their jobs
    CALL their wrappers in ``schema``."""
    revoke = [("CREATE", user) for user in granted.create]
    revoke += [("USAGE", user) for user in granted.usage if user not in creators]
    if not revoke or conn.broken:
        return
    with conn.transaction():
        for privilege, user in revoke:
            conn.execute(sql.SQL("REVOKE {} ON SCHEMA {} FROM {}").format(
                sql.SQL(privilege), sql.Identifier(schema), sql.Identifier(user)))


def _create(conn: Conn, sessions: Sessions, job: JobPlan, *, ready: bool, dry_run: bool,
            timeout_ms: int | None) -> Outcome:
    """Admit one planned job on its user's session; the outcome says what became of it."""
    try:
        session = sessions.get(job.principal)
    except LoginFailed as exc:  # logged in before, but not now
        return job.outcome("unmapped", str(exc))
    try:
        taken = admit(session, job, ready=ready, dry_run=dry_run, timeout_ms=timeout_ms)
        if taken is not None:
            return taken
    except (RadixError, psycopg.Error) as exc:
        if conn.broken:
            raise  # the importer's connection is gone: no later job could be imported either
        if session.broken or session.closed:
            sessions.close()
        return job.outcome("refused", _message(exc))
    state = "" if job.row.active else " (disabled, as in pg_cron)"
    if dry_run and not ready:
        state += (f" (admitted in {job.principal}'s temporary schema: {job.name.schema} is missing or not open "
                  f"to {job.principal} yet, and the import makes it so)")
    return job.outcome("would create" if dry_run else "created", job.describe() + state)


def _message(exc: Exception) -> str:
    if isinstance(exc, psycopg.Error):
        return exc.diag.message_primary or str(exc).splitlines()[0]
    return str(exc)


def failed(outcomes: Sequence[Outcome]) -> bool:
    """True when some row could not be imported (unmapped or refused): the CLI exits 1."""
    return any(o.action in ("unmapped", "refused") for o in outcomes)
