"""Admission against a real PostgreSQL: who may create, alter and drop jobs as whom (SPEC §1, §2, §4).

Every refusal is checked twice: the SQLSTATE, and that nothing was written (row counts or whole rows of the
catalog, read as superuser). Job DDL goes through ``catalog.execute_job_ddl``; the SQL path calls
``radix.create_job`` and friends directly, on a connection logged in as the creator.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, LiteralString

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from radixjobs import catalog, ddl
from radixjobs.engine.definitions import build_call, dollar_quoted
from radixjobs.errors import RadixError
from radixjobs.model import CreateJob, quote_ident
from radixjobs.scripts import run_script
from tests.support import PgCluster

Conn = psycopg.Connection[Any]
RoleFactory = Callable[..., str]

JOB = "app.nightly"
EVERY_5_MIN = {"every": "5 minutes"}
TASK_SQL = """
CREATE SCHEMA app;
CREATE SCHEMA work;
CREATE TABLE work.calls (id bigserial PRIMARY KEY, tag text NOT NULL);
GRANT INSERT ON work.calls TO PUBLIC;
GRANT USAGE ON SEQUENCE work.calls_id_seq TO PUBLIC;
CREATE PROCEDURE work.task(n integer DEFAULT 0) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO work.calls (tag) VALUES ('task ' || n);
END $$;
"""


# ------------------------------------------------------------------------------------------ the database


@dataclass(frozen=True)
class Counts:
    jobs: int
    states: int
    histories: int


@dataclass
class Site:
    """The test's database: schema ``app`` for jobs, ``work.task(n int)`` to call, connections as any role."""

    pg: PgCluster
    dbname: str
    su: Conn
    make_role: RoleFactory
    opened: list[Conn] = field(default_factory=list)

    def role(self, prefix: str, options: str = "LOGIN") -> str:
        return self.make_role(prefix, options)

    def connect(self, role: str) -> Conn:
        """An autocommit connection logged in as ``role`` (trust authentication over the socket)."""
        conn = psycopg.connect(self.pg.dsn_for(self.dbname, user=role), autocommit=True)
        self.opened.append(conn)
        return conn

    def run(self, statement: LiteralString, *identifiers: str) -> None:
        """A superuser statement whose ``{}`` placeholders are identifiers."""
        self.su.execute(sql.SQL(statement).format(*map(sql.Identifier, identifiers)))

    def script(self, text: str) -> None:
        for result in run_script(self.su, text):
            assert result.status, result.statement

    def may_create_in_app(self, *creators: str) -> None:
        for creator in creators:
            self.run("GRANT CREATE ON SCHEMA app TO {}", creator)

    def counts(self) -> Counts:
        row = self.su.execute(
            "SELECT (SELECT count(*) FROM radix.jobs), (SELECT count(*) FROM radix.radix_system_job_state), "
            "(SELECT count(*) FROM radix.radix_system_job_history)").fetchone()
        assert row is not None
        return Counts(*row)

    def snapshot(self) -> list[tuple[Any, ...]]:
        """Every catalog row, in a stable order: equal snapshots mean nothing changed."""
        return self.su.execute(
            "SELECT to_jsonb(j), to_jsonb(s) FROM radix.jobs j "
            "LEFT JOIN radix.radix_system_job_state s USING (job_id) ORDER BY j.job_id").fetchall()

    def job(self, name: str = JOB) -> dict[str, Any] | None:
        """The catalog row of a job with its state (status and version as ``state_*``), read as superuser."""
        with self.su.cursor(row_factory=dict_row) as cur:
            return cur.execute(
                "SELECT j.*, s.status AS state_status, s.definition_version AS state_version, s.attempt, "
                "s.anchor_ns, s.planned_ns, s.due_ns, s.idempotency_key, s.lease_node, s.lease_token, "
                "s.lease_expires_at FROM radix.jobs j LEFT JOIN radix.radix_system_job_state s USING (job_id) "
                "WHERE quote_ident(j.schema_name) || '.' || quote_ident(j.job_name) = %s", (name,)).fetchone()

    def existing_job(self, name: str = JOB) -> dict[str, Any]:
        job = self.job(name)
        assert job is not None, f"job {name} does not exist"
        return job


def open_site(pg: PgCluster, roles: RoleFactory, db: str) -> Iterator[Site]:
    """The ``site`` fixture's body (shared with the other admission test modules)."""
    with psycopg.connect(db, autocommit=True) as su:
        here = Site(pg, str(conninfo_to_dict(db)["dbname"]), su, roles)
        here.script(TASK_SQL)
        try:
            yield here
        finally:
            for conn in here.opened:
                conn.close()


@pytest.fixture
def site(pg: PgCluster, roles: RoleFactory, db: str) -> Iterator[Site]:
    # `roles` is requested before `db`, so the roles are dropped only after the database is gone
    yield from open_site(pg, roles, db)


# ------------------------------------------------------------------------------------------ helpers


@dataclass(frozen=True)
class Outcome:
    """What an admission call did: code None when it succeeded."""

    code: str | None
    message: str = ""


def outcome(action: Callable[[], object]) -> Outcome:
    """Run an action and report its SQLSTATE (AdmissionError/ParseError code, or PostgreSQL's own)."""
    try:
        action()
    except RadixError as exc:
        return Outcome(exc.code, str(exc))
    except psycopg.Error as exc:
        return Outcome(exc.sqlstate, str(exc))
    return Outcome(None)


def create_ddl(principal: str, name: str = JOB, call: str = "work.task(1)", *,
               schedule: str = "EVERY INTERVAL '5 minutes'", if_not_exists: bool = False,
               flag: str = "") -> str:
    maybe = "IF NOT EXISTS " if if_not_exists else ""
    return f"CREATE JOB {maybe}{name} SCHEDULE {schedule} RUN AS {quote_ident(principal)} CALL {call} {flag}"


def create_sql(conn: Conn, principal: str, name: str = JOB, procedure: str = "work.task",
               arguments: Any = None, *, if_not_exists: bool = False) -> uuid.UUID:
    row = conn.execute(
        "SELECT radix.create_job(%s, %s, %s, %s, %s, if_not_exists => %s)",
        (name, Jsonb(EVERY_5_MIN), principal, procedure, Jsonb({"n": 1} if arguments is None else arguments),
         if_not_exists)).fetchone()
    assert row is not None
    return uuid.UUID(str(row[0]))


CreatePath = Callable[[Conn, str], object]
CREATE_PATHS: dict[str, CreatePath] = {
    "ddl": lambda conn, principal: catalog.execute_job_ddl(conn, create_ddl(principal)),
    "sql": lambda conn, principal: create_sql(conn, principal),
}


def assert_refused(site: Site, action: Callable[[], object], code: str, message: str = "") -> Outcome:
    """The action fails with ``code`` (and ``message`` in its text) and changes no catalog row."""
    before_counts, before_rows = site.counts(), site.snapshot()
    result = outcome(action)
    assert result.code == code, result
    assert message.lower() in result.message.lower(), result
    assert site.counts() == before_counts
    assert site.snapshot() == before_rows
    return result


def assert_job(site: Site, owner: str, principal: str, name: str = JOB) -> dict[str, Any]:
    job = site.existing_job(name)
    assert (job["owner_name"], job["principal_name"]) == (owner, principal)
    oids = site.su.execute("SELECT %s::regrole::oid, %s::regrole::oid",
                           (quote_ident(owner), quote_ident(principal))).fetchone()
    assert (job["owner_oid"], job["principal_oid"]) == oids
    assert job["state_status"] == "scheduled"
    assert job["state_version"] == job["definition_version"] == 1
    return job


def add_history(site: Site, name: str = JOB) -> None:
    """One finished attempt in the job's history (written as superuser, as the engine would)."""
    site.su.execute(
        "INSERT INTO radix.radix_system_job_history (job_id, definition_version, planned_ns, attempt, "
        "idempotency_key, status) SELECT job_id, 1, 1, 1, job_id || '/1', 'succeeded' FROM radix.jobs "
        "WHERE quote_ident(schema_name) || '.' || quote_ident(job_name) = %s", (name,))


# ------------------------------------------------------------------------------------------ 1. who may schedule as whom


@dataclass(frozen=True)
class Grant:
    """How a case relates creator and principal; returns (creator, principal)."""

    setup: Callable[[Site], tuple[str, str]]
    allowed: bool
    message: str = ""


def _pair(site: Site, grant: LiteralString | None = None, *, creator_options: str = "LOGIN",
          principal_options: str = "LOGIN") -> tuple[str, str]:
    creator, principal = site.role("creator", creator_options), site.role("principal", principal_options)
    if grant is not None:
        site.run(grant, principal, creator)
    return creator, principal


def _self(site: Site) -> tuple[str, str]:
    principal = site.role("principal")
    return principal, principal


def _createrole_creator(site: Site) -> tuple[str, str]:
    """PostgreSQL 16+: a CREATEROLE role that creates a role gets ADMIN on it, without SET or INHERIT."""
    creator, principal = site.role("creator", "LOGIN CREATEROLE"), site.role("principal")
    site.run("DROP ROLE {}", principal)  # the roles fixture still owns the name and drops it after the test
    site.connect(creator).execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(principal)))
    row = site.su.execute("SELECT pg_has_role(%s, %s, 'MEMBER'), pg_has_role(%s, %s, 'SET')",
                          (creator, principal, creator, principal)).fetchone()
    assert row == (True, False)
    return creator, principal


def _indirect(site: Site) -> tuple[str, str]:
    creator, principal = _pair(site)
    group = site.role("group", "NOLOGIN")
    site.run("GRANT {} TO {}", principal, group)
    site.run("GRANT {} TO {}", group, creator)
    return creator, principal


GRANTS: dict[str, Grant] = {
    "superuser creator": Grant(lambda s: _pair(s, creator_options="LOGIN SUPERUSER"), True),
    "principal itself": Grant(_self, True),
    "member with SET": Grant(lambda s: _pair(s, "GRANT {} TO {}"), True),
    "member WITH SET FALSE": Grant(lambda s: _pair(s, "GRANT {} TO {} WITH SET FALSE"), False, "schedule a job as"),
    "ADMIN only": Grant(lambda s: _pair(s, "GRANT {} TO {} WITH ADMIN TRUE, INHERIT FALSE, SET FALSE"), False,
                        "schedule a job as"),
    "CREATEROLE creator of the principal": Grant(_createrole_creator, False, "schedule a job as"),
    "indirect member through a group": Grant(_indirect, True),
    "non-member": Grant(_pair, False, "schedule a job as"),
    "NOLOGIN principal": Grant(lambda s: _pair(s, "GRANT {} TO {}", principal_options="NOLOGIN"), False,
                               "cannot log in"),
    "superuser principal of a non-superuser": Grant(
        lambda s: _pair(s, "GRANT {} TO {}", principal_options="LOGIN SUPERUSER"), False, "superuser"),
}


@pytest.mark.parametrize("path", sorted(CREATE_PATHS))
@pytest.mark.parametrize("case", list(GRANTS), ids=str)
def test_who_may_schedule_as_whom(site: Site, case: str, path: str) -> None:
    grant = GRANTS[case]
    creator, principal = grant.setup(site)
    site.may_create_in_app(creator)
    site.run("GRANT USAGE ON SCHEMA work TO {}", principal)
    create = CREATE_PATHS[path]
    as_creator = site.connect(creator)
    if grant.allowed:
        assert outcome(lambda: create(as_creator, principal)) == Outcome(None)
        assert_job(site, creator, principal)
        assert site.counts() == Counts(1, 1, 0)
    else:
        assert_refused(site, lambda: create(as_creator, principal), "42501", grant.message)
        assert site.counts() == Counts(0, 0, 0)


def test_set_role_acts_as_the_role_set(site: Site) -> None:
    """After SET ROLE, the job belongs to the role set, as any object created there would."""
    creator, principal = _pair(site, "GRANT {} TO {}")
    site.may_create_in_app(principal)
    conn = site.connect(creator)
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(principal)))
    catalog.execute_job_ddl(conn, create_ddl(principal))
    assert_job(site, principal, principal)


# ------------------------------------------------------------------------------------------ 2. other admission errors


@dataclass(frozen=True)
class BadCreate:
    code: str
    job: str = "app.j"
    run_as: str = "{p}"  # {p}: the creator, who is its own principal
    procedure: str = "work.task"
    parser_code: str | None = None  # the DDL parser refuses it before the database sees it


BAD_CREATES: dict[str, BadCreate] = {
    "job schema missing": BadCreate("3F000", job="nosuch.j"),
    "no CREATE on the job schema": BadCreate("42501", job="locked.j"),
    "principal missing": BadCreate("42704", run_as="nosuch_role_x"),
    "procedure missing": BadCreate("42883", procedure="work.nosuch"),
    "procedure schema missing": BadCreate("3F000", procedure="nowhere.task"),
    "unqualified job name": BadCreate("42602", job="j", parser_code="42601"),
    "unqualified procedure": BadCreate("42602", procedure="task", parser_code="42601"),
    "three-part job name": BadCreate("42602", job="db.app.j", parser_code="42601"),
}


@pytest.mark.parametrize("path", ["ddl", "sql"])
@pytest.mark.parametrize("case", list(BAD_CREATES), ids=str)
def test_admission_errors(site: Site, case: str, path: str) -> None:
    bad = BAD_CREATES[case]
    principal = site.role("principal")
    site.run("CREATE SCHEMA locked")
    site.may_create_in_app(principal)
    conn = site.connect(principal)
    run_as = bad.run_as.format(p=principal)
    if path == "ddl":
        text = create_ddl(run_as, bad.job, f"{bad.procedure}(1)")
        assert_refused(site, lambda: catalog.execute_job_ddl(conn, text), bad.parser_code or bad.code)
    else:
        assert_refused(site, lambda: create_sql(conn, run_as, bad.job, bad.procedure), bad.code)
    assert site.counts() == Counts(0, 0, 0)


@pytest.mark.parametrize("path", ["ddl", "sql"])
def test_duplicate_job_and_if_not_exists(site: Site, path: str) -> None:
    principal = site.role("principal")
    site.may_create_in_app(principal)
    conn = site.connect(principal)

    def create(if_not_exists: bool) -> uuid.UUID | None:
        if path == "sql":
            return create_sql(conn, principal, if_not_exists=if_not_exists)
        catalog.execute_job_ddl(conn, create_ddl(principal, if_not_exists=if_not_exists))
        return None

    create(False)
    first = site.existing_job()
    assert_refused(site, lambda: create(False), "42710", "already exists")
    returned = create(True)
    assert returned in (None, first["job_id"])
    assert site.counts() == Counts(1, 1, 0)
    assert site.existing_job() == first


def test_if_not_exists_returns_the_existing_id_from_python(site: Site) -> None:
    principal = site.role("principal")
    site.may_create_in_app(principal)
    conn = site.connect(principal)
    stmt = ddl.parse_job_statement(create_ddl(principal, if_not_exists=True))
    assert isinstance(stmt, CreateJob)
    first = catalog.create_job(conn, stmt)
    assert catalog.create_job(conn, stmt) == first
    assert site.counts() == Counts(1, 1, 0)


def test_quoted_names_keep_their_case(site: Site) -> None:
    principal = site.role("principal")
    site.run('CREATE SCHEMA "Ops"')
    site.run('GRANT CREATE ON SCHEMA "Ops" TO {}', principal)
    conn = site.connect(principal)
    catalog.execute_job_ddl(conn, create_ddl(principal, name='"Ops"."Nightly Run"'))
    job = site.existing_job('"Ops"."Nightly Run"')
    assert (job["schema_name"], job["job_name"]) == ("Ops", "Nightly Run")
    assert catalog.get_job(conn, '"Ops"."Nightly Run"') is not None
    assert_refused(site, lambda: catalog.execute_job_ddl(conn, create_ddl(principal, name="ops.nightly_run")),
                   "3F000")


# ------------------------------------------------------------------------------------------ 3. direct catalog writes


DIRECT_WRITES: dict[str, LiteralString] = {
    "read jobs": "SELECT * FROM radix.jobs",
    "insert jobs": "INSERT INTO radix.jobs (schema_name, job_name, owner_oid, owner_name, principal_oid, "
                   "principal_name, procedure_oid, procedure_signature, schedule_kind, interval_ns) "
                   "SELECT 'app', 'forged', oid, rolname, oid, rolname, 'work.task(integer)'::regprocedure, "
                   "'work.task(integer)', 'every', 1000000000 FROM pg_roles WHERE rolname = current_user",
    "update jobs": "UPDATE radix.jobs SET principal_name = 'postgres'",
    "delete jobs": "DELETE FROM radix.jobs",
    "truncate jobs": "TRUNCATE radix.jobs CASCADE",
    "insert state": "INSERT INTO radix.radix_system_job_state (job_id, definition_version, status, anchor_ns) "
                    "VALUES (gen_random_uuid(), 1, 'scheduled', 0)",
    "update state": "UPDATE radix.radix_system_job_state SET status = 'running', lease_token = gen_random_uuid()",
    "delete state": "DELETE FROM radix.radix_system_job_state",
    "insert history": "INSERT INTO radix.radix_system_job_history (job_id, definition_version, planned_ns, "
                      "attempt, idempotency_key, status) SELECT job_id, 1, 0, 1, 'k', 'succeeded' "
                      "FROM radix.job_overview",
    "update history": "UPDATE radix.radix_system_job_history SET status = 'succeeded'",
    "delete history": "DELETE FROM radix.radix_system_job_history",
    "internal job lookup": "SELECT radix._find_job('app.nightly')",
    "internal arming": "SELECT radix._arm_state(j) FROM radix.jobs j",
    "internal caller check": "SELECT radix._caller(current_user)",
    "internal admission check": "SELECT radix._check_admission(0, ARRAY['app', 'x'], current_user, false)",
}


@pytest.mark.parametrize("statement", list(DIRECT_WRITES), ids=str)
def test_direct_catalog_access_is_refused(site: Site, statement: str) -> None:
    owner = site.role("owner")
    site.may_create_in_app(owner)
    conn = site.connect(owner)
    catalog.execute_job_ddl(conn, create_ddl(owner))
    add_history(site)
    assert_refused(site, lambda: conn.execute(DIRECT_WRITES[statement]), "42501")
    assert site.counts() == Counts(1, 1, 1)


IMPERSONATIONS: dict[str, LiteralString] = {
    "_create_job": "SELECT radix._create_job(%(victim)s::text, 'app.forged', '{\"every\": \"5 minutes\"}', "
                   "%(victim)s::text, 'work.task', '[]', true, false, '{}')",
    "_change_job": "SELECT radix._change_job(%(victim)s, 'app.nightly', false, NULL, NULL, NULL, NULL, NULL, "
                   "NULL, NULL)",
    "_request_ticks": "SELECT radix._request_ticks(%(victim)s, 'app.nightly', ARRAY[1]::bigint[], 'run')",
    "_drop_job": "SELECT radix._drop_job(%(victim)s, 'app.nightly', false, true)",
}


@pytest.mark.parametrize("membership", ["none", "WITH SET FALSE"])
@pytest.mark.parametrize("function", list(IMPERSONATIONS), ids=str)
def test_internal_functions_refuse_a_claimed_creator(site: Site, function: str, membership: str) -> None:
    """Naming another role as creator gains nothing: the session must be able to SET ROLE to it."""
    victim, attacker = site.role("victim"), site.role("attacker")
    site.may_create_in_app(victim, attacker)
    if membership != "none":
        site.run("GRANT {} TO {} WITH SET FALSE", victim, attacker)
    catalog.execute_job_ddl(site.connect(victim), create_ddl(victim))
    conn = site.connect(attacker)
    assert_refused(site, lambda: conn.execute(IMPERSONATIONS[function], {"victim": victim}), "42501")


@dataclass(frozen=True)
class Trap:
    """Code of the creator's that admission might run while looking at the CALL."""

    setup: str  # run as the creator ({me}), on the connection that then creates the job
    call: str
    code: str | None  # the refusal it causes, or None: admitted (the trap was never sprung)


TRAPS: dict[str, Trap] = {
    "domain CHECK": Trap("""
        CREATE FUNCTION mine.chk(v text) RETURNS boolean LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'ran as %', current_user; END $$;
        CREATE DOMAIN mine.d AS text CHECK (mine.chk(VALUE));
        CREATE PROCEDURE mine.task(a mine.d) LANGUAGE plpgsql AS $$ BEGIN END $$;""", "mine.task('x')", "P0001"),
    "implicit cast": Trap("""
        CREATE TYPE mine.t AS (x text);
        CREATE FUNCTION mine.to_t(v text) RETURNS mine.t LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'ran as %', current_user; END $$;
        CREATE CAST (text AS mine.t) WITH FUNCTION mine.to_t(text) AS IMPLICIT;
        CREATE PROCEDURE mine.task(a mine.t) LANGUAGE plpgsql AS $$ BEGIN END $$;""", "mine.task('x'::text)",
                          "P0001"),
    "temporary function named like a resolver probe": Trap("""
        CREATE PROCEDURE mine.task(a numeric, b numeric, c numeric) LANGUAGE plpgsql AS $$ BEGIN END $$;
        CREATE FUNCTION pg_temp.radix_call_probe(a integer, b integer, c integer) RETURNS oid LANGUAGE plpgsql
        AS $$ BEGIN RAISE EXCEPTION 'ran as %', current_user; END $$;""", "mine.task(1, 2, 3)", None),
}


@pytest.mark.parametrize("trap", list(TRAPS), ids=str)
def test_admission_runs_the_creators_code_with_the_creators_rights(site: Site, trap: str) -> None:
    """Resolving and converting the CALL may run the creator's code (casts, domain checks): never as the
    catalog's owner, or any role could read and write as a superuser."""
    spec = TRAPS[trap]
    creator = site.role("creator")
    site.run("CREATE SCHEMA mine AUTHORIZATION {}", creator)
    site.may_create_in_app(creator)
    conn = site.connect(creator)
    list(run_script(conn, spec.setup))

    def create() -> object:
        return catalog.execute_job_ddl(conn, create_ddl(creator, call=spec.call))

    if spec.code is None:
        assert outcome(create) == Outcome(None)
        assert site.existing_job()["procedure_signature"] == "mine.task(numeric,numeric,numeric)"
        return
    assert_refused(site, create, spec.code, f"ran as {creator}")
    by_postgres = outcome(lambda: conn.execute(f"CALL {spec.call}".encode()))
    assert by_postgres.code == spec.code
    assert f"ran as {creator}" in by_postgres.message
    assert site.counts() == Counts(0, 0, 0)


Binding = dict[str, Any]
FORGERIES: dict[str, tuple[Callable[[Binding, dict[str, int]], None], str | None]] = {
    "a function's oid": (lambda b, oids: b.update(procedure_oid=oids["work.fn(integer)"]), "22023"),
    "another procedure's oid": (lambda b, oids: b.update(procedure_oid=oids["work.other(integer)"]), "22023"),
    "a parameter that does not exist": (lambda b, _: b["arguments"][0].update(position=5), "22023"),
    "another type": (lambda b, _: b["arguments"][0].update(type_oid=25), "22023"),
    "a pseudo-type": (lambda b, _: b["arguments"][0].update(type_oid=2281), "22023"),
    "a value that is not text": (lambda b, _: b["arguments"][0].update(value=1), "22023"),
    "not a binding at all": (lambda b, _: b.update(arguments="n => 1"), "22023"),
    # what is not checked is not taken from the binding: type and parameter names come from the catalog
    "a type name with SQL in it": (lambda b, _: b["arguments"][0].update(type="integer); DROP TABLE x; --"), None),
    "a parameter name with SQL in it": (lambda b, _: b["arguments"][0].update(name='n" => 1); --'), None),
    "a signature that lies": (lambda b, _: b.update(signature="work.other(integer)"), None),
}


@pytest.mark.parametrize("forgery", list(FORGERIES), ids=str)
def test_the_definer_side_stores_only_a_valid_binding(site: Site, forgery: str) -> None:
    """radix._create_job is callable directly, with a binding the caller made up: it must not trust it."""
    forge, code = FORGERIES[forgery]
    site.script("CREATE FUNCTION work.fn(n integer) RETURNS integer LANGUAGE sql RETURN n;"
                "CREATE PROCEDURE work.other(n integer) LANGUAGE sql BEGIN ATOMIC SELECT 1; END;")
    oids = dict(site.su.execute("SELECT to_regprocedure(s)::text, to_regprocedure(s)::oid "
                                "FROM unnest(ARRAY['work.fn(integer)', 'work.other(integer)']) s").fetchall())
    me = site.role("creator")
    site.may_create_in_app(me)
    conn = site.connect(me)
    row = conn.execute("SELECT radix._resolve_call('work', 'task', %s)",
                       (Jsonb([{"kind": "integer", "value": "1"}]),)).fetchone()
    assert row is not None
    binding: Binding = row[0]
    forge(binding, oids)

    def create() -> object:
        return conn.execute("SELECT radix._create_job(current_user, %s, %s, current_user, 'work.task', %s, true, "
                            "false, '{}')", (JOB, Jsonb(EVERY_5_MIN), Jsonb(binding)))

    if code is not None:
        assert_refused(site, create, code, "invalid argument binding")
        return
    assert outcome(create) == Outcome(None)
    job = site.existing_job()
    assert job["procedure_signature"] == "work.task(integer)"
    assert [(a["name"], a["type"], a["value"]) for a in job["arguments"]] == [("n", "integer", "1")]


def test_job_overview_shows_a_role_its_own_jobs(site: Site) -> None:
    alice, bob, carol = site.role("alice"), site.role("bob"), site.role("carol")
    site.run("GRANT {} TO {}", alice, carol)  # carol is a member of alice: she sees (and manages) alice's jobs
    site.may_create_in_app(alice, bob)
    for who in (alice, bob):
        catalog.execute_job_ddl(site.connect(who), create_ddl(who, name=f"app.{who}"))
        add_history(site, f"app.{who}")

    def visible(role: str) -> tuple[set[str], set[str]]:
        conn = site.connect(role)
        jobs = {row["job_name"] for row in catalog.list_jobs(conn)}
        history = {row[0] for row in conn.execute("SELECT name FROM radix.job_history").fetchall()}
        return jobs, {name.split(".")[1] for name in history}

    assert visible(alice) == ({alice}, {alice})
    assert visible(bob) == ({bob}, {bob})
    assert visible(carol) == ({alice}, {alice})
    assert {row["job_name"] for row in catalog.list_jobs(site.su)} == {alice, bob}
    assert catalog.get_job(site.connect(alice), f"app.{bob}") is None


# ------------------------------------------------------------------------------------------ 5. ALTER and DROP


def simulate_claim(site: Site, *, live: bool = True) -> None:
    """What a scheduler node's claim leaves in the state row (a live or an expired lease)."""
    site.su.execute(
        "UPDATE radix.radix_system_job_state SET status = 'running', attempt = 2, lease_node = 'node-1', "
        "lease_token = gen_random_uuid(), idempotency_key = job_id || '/' || planned_ns, "
        "lease_expires_at = now() + CASE WHEN %s THEN interval '5 minutes' ELSE interval '-1 second' END",
        (live,))


def test_enable_disable_bumps_the_version_and_rearms_the_state(site: Site) -> None:
    owner = site.role("owner")
    site.may_create_in_app(owner)
    conn = site.connect(owner)
    catalog.execute_job_ddl(conn, create_ddl(owner))
    created = site.existing_job()
    simulate_claim(site)

    assert catalog.alter_job(conn, JOB, enabled=False) is True
    disabled = site.existing_job()
    assert (disabled["enabled"], disabled["definition_version"], disabled["state_version"]) == (False, 2, 2)
    assert (disabled["state_status"], disabled["attempt"], disabled["due_ns"]) == ("disabled", 0, None)
    assert (disabled["lease_node"], disabled["lease_token"], disabled["lease_expires_at"]) == (None, None, None)
    assert disabled["idempotency_key"] is None
    assert disabled["anchor_ns"] > created["anchor_ns"]

    before = site.snapshot()
    assert catalog.alter_job(conn, JOB, enabled=False) is False  # unchanged: no bump, no re-arm
    assert catalog.execute_job_ddl(conn, "ALTER JOB app.nightly DISABLE") == "ALTER JOB"
    assert site.snapshot() == before

    assert catalog.execute_job_ddl(conn, "alter job APP.NIGHTLY enable;") == "ALTER JOB"
    enabled = site.existing_job()
    assert (enabled["enabled"], enabled["definition_version"], enabled["state_version"]) == (True, 3, 3)
    assert (enabled["state_status"], enabled["attempt"], enabled["lease_token"]) == ("scheduled", 0, None)
    assert enabled["anchor_ns"] > disabled["anchor_ns"]
    assert enabled["planned_ns"] == enabled["due_ns"] == enabled["anchor_ns"] + 300 * 10**9
    assert site.counts() == Counts(1, 1, 0)


def test_create_disabled_then_enable(site: Site) -> None:
    owner = site.role("owner")
    site.may_create_in_app(owner)
    conn = site.connect(owner)
    catalog.execute_job_ddl(conn, create_ddl(owner, flag="DISABLE"))
    job = site.existing_job()
    assert (job["enabled"], job["state_status"], job["due_ns"]) == (False, "disabled", None)
    assert catalog.alter_job(conn, JOB, enabled=True) is True
    assert site.existing_job()["definition_version"] == 2


ALTER_DROP = {
    "ALTER": "ALTER JOB app.nightly DISABLE",
    "DROP": "DROP JOB app.nightly",
    "DROP CASCADE": "DROP JOB app.nightly CASCADE",
}


def _manager(site: Site, owner: str, principal: str, relation: str) -> str:
    """The role that tries to alter or drop the job (principal is not the owner here)."""
    if relation == "owner":
        return owner
    if relation == "principal":
        return principal
    who = site.role(relation.replace(" ", "_"), "LOGIN SUPERUSER" if relation == "superuser" else "LOGIN")
    if relation == "member of owner":
        site.run("GRANT {} TO {}", owner, who)
    return who


@pytest.mark.parametrize(("relation", "allowed"), [
    ("owner", True), ("member of owner", True), ("superuser", True), ("principal", False), ("stranger", False)])
@pytest.mark.parametrize("statement", list(ALTER_DROP), ids=str)
def test_only_the_owner_may_alter_or_drop(site: Site, statement: str, relation: str, allowed: bool) -> None:
    owner, principal = _pair(site, "GRANT {} TO {}")
    site.may_create_in_app(owner)
    catalog.execute_job_ddl(site.connect(owner), create_ddl(principal))
    conn = site.connect(_manager(site, owner, principal, relation))
    if not allowed:
        assert_refused(site, lambda: catalog.execute_job_ddl(conn, ALTER_DROP[statement]), "42501", "owner")
        return
    assert catalog.execute_job_ddl(conn, ALTER_DROP[statement]) == statement.split()[0] + " JOB"
    if statement == "ALTER":
        assert site.existing_job()["definition_version"] == 2
    else:
        assert site.counts() == Counts(0, 0, 0)


def test_alter_and_drop_of_missing_jobs(site: Site) -> None:
    owner = site.role("owner")
    conn = site.connect(owner)
    assert_refused(site, lambda: catalog.execute_job_ddl(conn, "ALTER JOB app.missing ENABLE"), "42704")
    assert_refused(site, lambda: catalog.execute_job_ddl(conn, "DROP JOB app.missing"), "42704")
    assert catalog.execute_job_ddl(conn, "DROP JOB IF EXISTS app.missing") == "DROP JOB"
    assert catalog.drop_job(conn, "app.missing", if_exists=True) is False
    assert conn.execute("SELECT radix.drop_job('app.missing', if_exists => true)").fetchone() == (False,)


def test_drop_restrict_waits_for_a_live_claim(site: Site) -> None:
    owner = site.role("owner")
    site.may_create_in_app(owner)
    conn = site.connect(owner)
    catalog.execute_job_ddl(conn, create_ddl(owner))
    add_history(site)
    site.su.execute("SELECT radix.register_node('node-1', 'h', 1)")  # alive while site.su is open
    simulate_claim(site)
    assert_refused(site, lambda: catalog.execute_job_ddl(conn, "DROP JOB app.nightly RESTRICT"), "55006", "running")
    assert_refused(site, lambda: catalog.execute_job_ddl(conn, "DROP JOB app.nightly"), "55006")
    simulate_claim(site, live=False)  # an expired lease is no claim
    assert catalog.execute_job_ddl(conn, "DROP JOB app.nightly RESTRICT") == "DROP JOB"
    assert site.counts() == Counts(0, 0, 0)


def test_drop_cascade_ends_a_live_claim(site: Site) -> None:
    owner = site.role("owner")
    site.may_create_in_app(owner)
    conn = site.connect(owner)
    catalog.execute_job_ddl(conn, create_ddl(owner))
    add_history(site)
    simulate_claim(site)
    assert catalog.drop_job(conn, JOB, cascade=True) is True
    assert site.counts() == Counts(0, 0, 0)


def test_drop_and_dependent_rows(site: Site) -> None:
    owner = site.role("owner")
    site.may_create_in_app(owner)
    conn = site.connect(owner)
    catalog.execute_job_ddl(conn, create_ddl(owner))
    site.script("CREATE TABLE app.audit (id int PRIMARY KEY, job_id uuid REFERENCES radix.jobs (job_id));"
                "INSERT INTO app.audit SELECT 1, job_id FROM radix.jobs;"
                "INSERT INTO app.audit VALUES (2, NULL);")
    assert_refused(site, lambda: catalog.execute_job_ddl(conn, "DROP JOB app.nightly"), "2BP01", "depend")
    assert_refused(site, lambda: catalog.execute_job_ddl(conn, "DROP JOB app.nightly RESTRICT"), "2BP01")
    # CASCADE deletes the dependent rows with the caller's own rights (PostgreSQL's checks, RLS,
    # triggers): without them, nothing happens
    assert_refused(site, lambda: catalog.execute_job_ddl(conn, "DROP JOB app.nightly CASCADE"), "42501",
                   "permission denied")
    assert site.su.execute("SELECT count(*) FROM app.audit").fetchone() == (2,)
    site.run("GRANT USAGE ON SCHEMA app TO {}", owner)
    site.run("GRANT SELECT, DELETE ON app.audit TO {}", owner)
    assert catalog.execute_job_ddl(conn, "DROP JOB app.nightly CASCADE") == "DROP JOB"
    assert site.su.execute("SELECT id FROM app.audit").fetchall() == [(2,)]
    assert site.counts() == Counts(0, 0, 0)


def test_state_history_and_engine_bookkeeping_go_with_the_job(site: Site) -> None:
    """The job's own rows in radix (state, history, idempotency keys) are not 'dependent objects'."""
    owner = site.role("owner")
    site.may_create_in_app(owner)
    conn = site.connect(owner)
    catalog.execute_job_ddl(conn, create_ddl(owner))
    add_history(site)
    site.su.execute("INSERT INTO radix.idempotency_keys (idempotency_key, job_id) "
                    "SELECT job_id || '/1', job_id FROM radix.jobs")
    # a frame left by a non-atomic attempt that never reached its end (no foreign key: the trigger job_dropped)
    site.su.execute("INSERT INTO radix.attempt_frames "
                    "(pid, backend_start, job_id, attempt, planned_ns, idempotency_key, lease_token) "
                    "SELECT -1, now(), job_id, 1, 1, job_id || '/1', gen_random_uuid() FROM radix.jobs")
    assert catalog.execute_job_ddl(conn, "DROP JOB app.nightly RESTRICT") == "DROP JOB"
    assert site.counts() == Counts(0, 0, 0)
    assert site.su.execute("SELECT count(*) FROM radix.idempotency_keys").fetchone() == (0,)
    assert site.su.execute("SELECT count(*) FROM radix.attempt_frames").fetchone() == (0,)


# ------------------------------------------------------------------------------------------ 6. the seed's example


SEED_JOB = """CREATE JOB maintenance.expire_sessions
SCHEDULE EVERY INTERVAL '5 minute'
RUN AS {worker}
CALL auth.expire_sessions(batch_size => 1000)
ENABLE;"""
SEED_TAIL = """ALTER JOB maintenance.expire_sessions DISABLE;
ALTER JOB maintenance.expire_sessions ENABLE;
DROP JOB maintenance.expire_sessions RESTRICT;"""
SEED_SETUP = """
CREATE SCHEMA maintenance;
CREATE SCHEMA auth;
CREATE TABLE auth.sessions (id bigint PRIMARY KEY, expires_at timestamptz NOT NULL);
INSERT INTO auth.sessions SELECT g, now() + (3.5 - g) * interval '1 hour' FROM generate_series(1, 6) g;
GRANT USAGE ON SCHEMA auth TO {worker};
GRANT SELECT, DELETE ON auth.sessions TO {worker};
CREATE PROCEDURE auth.expire_sessions(batch_size integer DEFAULT 100)
LANGUAGE plpgsql AS $$
DECLARE
    removed integer;  -- semicolons inside the body; the script splitter must keep them
BEGIN
    DELETE FROM auth.sessions WHERE id IN (
        SELECT id FROM auth.sessions WHERE expires_at < now() ORDER BY id LIMIT batch_size);
    GET DIAGNOSTICS removed = ROW_COUNT;
    RAISE DEBUG 'expired % sessions; done', removed;
END $$;
"""


def seed_call_as_principal(site: Site, worker: str) -> None:
    """Run the stored CALL the way the engine will, on a connection logged in as the principal."""
    job = site.existing_job("maintenance.expire_sessions")
    stored = dollar_quoted(json.dumps(job["arguments"]), "stored") + "::pg_catalog.jsonb"
    site.connect(worker).execute(build_call("auth", "expire_sessions", job["arguments"], stored))
    assert site.su.execute("SELECT count(*) FROM auth.sessions").fetchone() == (3,)


@pytest.mark.parametrize("creator_kind", ["superuser", "member of the worker"])
def test_seed_example_statement_by_statement(site: Site, creator_kind: str) -> None:
    worker = site.role("maintenance_worker")
    site.script(SEED_SETUP.replace("{worker}", worker))
    conn = site.su
    if creator_kind != "superuser":
        maintainer = site.role("maintainer")
        site.run("GRANT {} TO {}", worker, maintainer)
        site.run("GRANT CREATE ON SCHEMA maintenance TO {}", maintainer)
        conn = site.connect(maintainer)
    owner = conn.info.user

    assert catalog.execute_job_ddl(conn, SEED_JOB.format(worker=worker)) == "CREATE JOB"
    job = assert_job(site, owner, worker, "maintenance.expire_sessions")
    assert job["procedure_signature"] == "auth.expire_sessions(integer)"
    assert [(a["name"], a["type"], a["value"], a["by_name"]) for a in job["arguments"]] == [
        ("batch_size", "integer", "1000", True)]
    assert (job["interval_ns"], job["enabled"]) == (300 * 10**9, True)
    seed_call_as_principal(site, worker)

    alter_disable, alter_enable, drop = SEED_TAIL.splitlines()
    assert catalog.execute_job_ddl(conn, alter_disable) == "ALTER JOB"
    assert site.existing_job("maintenance.expire_sessions")["state_status"] == "disabled"
    assert catalog.execute_job_ddl(conn, alter_enable) == "ALTER JOB"
    assert site.existing_job("maintenance.expire_sessions")["definition_version"] == 3
    assert catalog.execute_job_ddl(conn, drop) == "DROP JOB"
    assert site.counts() == Counts(0, 0, 0)


def test_seed_example_as_one_script(site: Site) -> None:
    worker = site.role("maintenance_worker")
    check = ("SELECT enabled, definition_version, principal, procedure FROM radix.job_overview "
             "WHERE name = 'maintenance.expire_sessions';\n")
    script = SEED_SETUP.replace("{worker}", worker) + SEED_JOB.format(worker=worker) + "\n" + check + SEED_TAIL
    results = list(run_script(site.su, script))
    statuses = [r.status for r in results]
    assert statuses[-6:] == ["CREATE PROCEDURE", "CREATE JOB", "SELECT 1", "ALTER JOB", "ALTER JOB", "DROP JOB"]
    assert results[-4].rows == [(True, 1, worker, "auth.expire_sessions(integer)")]
    assert site.counts() == Counts(0, 0, 0)
    body = site.su.execute("SELECT prosrc FROM pg_proc WHERE proname = 'expire_sessions'").fetchone()
    assert body is not None
    assert "done', removed;" in body[0]
