"""Import pg_cron's jobs (``cron.job``) as radixjobs jobs, through the same admission as CREATE JOB.

Invariants:

- Each job is one transaction: the import schema when it is missing, the wrapper procedure (owned by the
  importer, EXECUTE granted to the principal only), and ``radix.create_job``. A refusal at any step rolls
  all of it back, so a refused job leaves nothing behind.
- A dry run does the same work and rolls every transaction back: it reports what admission would refuse,
  and writes nothing.
- A job whose name already exists is left alone ("exists"), so importing twice creates nothing twice. A
  procedure of the wrapper's name is replaced only when the importer made it (its COMMENT says so).
- Rows for another database or another node are skipped, never retargeted silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import psycopg
from psycopg import sql

from radixjobs import catalog
from radixjobs.errors import RadixError
from radixjobs.imports.pg_cron_plan import (
    MARKER,
    CronJobRow,
    JobPlan,
    Unmappable,
    job_names,
    map_command,
    map_schedule,
)
from radixjobs.model import CreateJob, QualifiedName

Conn = psycopg.Connection[Any]
Action = Literal["created", "would create", "exists", "skipped", "unmapped", "refused"]
DEFAULT_SCHEMA = "cron_import"  # (a schema name may not begin with pg_)
LOCAL_NODES = frozenset({"", "localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True)
class Outcome:
    """What the import did with one pg_cron row."""

    jobid: int
    jobname: str | None
    job: str | None
    action: Action
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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
                   dry_run: bool = False, source: Conn | None = None,
                   timeout_ms: int | None = None) -> list[Outcome]:
    """Import every visible ``cron.job`` row into ``schema`` of the connected database, job by job.

    ``database``: import the rows of this pg_cron database (default: the connected one). ``source``: read
    ``cron.job`` there (default: ``conn``). ``timeout_ms``: each job's timeout (default: radixjobs').
    """
    src = read_cron_jobs(source or conn)
    if database is None:
        row = conn.execute("SELECT pg_catalog.current_database()").fetchone()
        assert row is not None
        database = str(row[0])
    names = job_names(src.rows)
    outcomes = []
    for row in src.rows:
        planned = plan(row, QualifiedName(schema, names[row.jobid]), database=database, port=src.port,
                       time_zone=src.time_zone)
        outcomes.append(planned if isinstance(planned, Outcome)
                        else apply(conn, planned, dry_run=dry_run, timeout_ms=timeout_ms))
    return outcomes


def apply(conn: Conn, job: JobPlan, *, dry_run: bool, timeout_ms: int | None) -> Outcome:
    """Create one planned job (and its wrapper) in one transaction; rolled back on refusal or dry run."""
    row = job.row

    def outcome(action: Action, reason: str) -> Outcome:
        return Outcome(row.jobid, row.jobname, str(job.name), action, reason)

    if catalog.get_job(conn, job.name) is not None:
        return outcome("exists", "a job of this name exists; left as it is")
    stmt = CreateJob(job.name, job.schedule, job.principal, job.procedure, job.command.arguments,
                     enabled=row.active)
    try:
        with conn.transaction() as tx:
            _ensure_schema(conn, job.name.schema)
            if job.command.body is not None:
                _create_wrapper(conn, job)
            catalog.create_job(conn, stmt, deadline_ms=timeout_ms)
            if dry_run:
                raise psycopg.Rollback(tx)
    except (RadixError, psycopg.Error) as exc:
        if conn.broken:
            raise  # the connection is gone: no later job could be imported either
        return outcome("refused", _message(exc))
    state = "" if row.active else " (disabled, as in pg_cron)"
    return outcome("would create" if dry_run else "created", job.describe() + state)


def _ensure_schema(conn: Conn, schema: str) -> None:
    """CREATE SCHEMA only when it is missing (IF NOT EXISTS still needs CREATE on the database)."""
    row = conn.execute("SELECT pg_catalog.to_regnamespace(%s::pg_catalog.text) IS NULL",
                       (str(sql.Identifier(schema).as_string(conn)),)).fetchone()
    if row and row[0]:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))


def _create_wrapper(conn: Conn, job: JobPlan) -> None:
    """The command as ``schema.name()``, runnable by the principal alone (and the importer, its owner)."""
    signature = sql.SQL("{}.{}()").format(sql.Identifier(job.name.schema), sql.Identifier(job.name.name))
    found = conn.execute("SELECT pg_catalog.obj_description(p, 'pg_proc') FROM "
                         "pg_catalog.to_regprocedure(%s::pg_catalog.text) AS p WHERE p IS NOT NULL",
                         (signature.as_string(conn),)).fetchone()
    if found is not None and not str(found[0] or "").startswith(MARKER):
        raise RadixError(f"procedure {job.name}() exists and was not made by the importer: drop it, or "
                         "import into another --schema")
    replace = sql.SQL("OR REPLACE ") if found is not None else sql.SQL("")
    assert job.command.body is not None
    conn.execute(sql.SQL("CREATE {}PROCEDURE {} LANGUAGE plpgsql AS {}").format(
        replace, signature, sql.Literal(job.command.body)))
    origin = f"{MARKER} {job.row.jobid}" + (f" ({job.row.jobname})" if job.row.jobname else "")
    principal = sql.Identifier(job.principal)
    conn.execute(sql.SQL("COMMENT ON PROCEDURE {} IS {}").format(signature, sql.Literal(origin)))
    conn.execute(sql.SQL("REVOKE ALL ON PROCEDURE {} FROM PUBLIC").format(signature))
    conn.execute(sql.SQL("GRANT EXECUTE ON PROCEDURE {} TO {}").format(signature, principal))
    usage = conn.execute("SELECT pg_catalog.has_schema_privilege(%s::pg_catalog.text, %s::pg_catalog.text, "
                         "'USAGE'::pg_catalog.text)", (job.principal, job.name.schema)).fetchone()
    if not (usage and usage[0]):
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(sql.Identifier(job.name.schema),
                                                                       principal))


def _message(exc: Exception) -> str:
    if isinstance(exc, psycopg.Error):
        return exc.diag.message_primary or str(exc).splitlines()[0]
    return str(exc)


def failed(outcomes: Sequence[Outcome]) -> bool:
    """True when some row could not be imported (unmapped or refused): the CLI exits 1."""
    return any(o.action in ("unmapped", "refused") for o in outcomes)
