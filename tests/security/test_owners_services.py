"""Hostile tenants against CSP services and ownership (issue #11, items 3 and 11).

Item 3: a role with no grants applied a document naming the operator's registered service and the daemon
ran it with the role's parameters; the refusal for an unknown name listed every registered service. Now a
service is usable only by roles the operator granted it to (radix.grant_service), checked at apply and by
the scheduler before every start, and no refusal enumerates services.

Item 11: a role granted the owner WITH INHERIT FALSE, SET FALSE (bare membership) disabled the victim's
job and rewrote its document. Now owning is having the owner's privileges (USAGE), as PostgreSQL has it.
The scheduler runs as `radixjobs docs run` subprocesses; tenants connect as themselves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.types.json import Jsonb

from radixjobs import catalog, documents
from radixjobs.documents import DocumentError
from radixjobs.errors import AdmissionError
from tests.acceptance.conftest import run_cli

SERVICE = "touch"
SPEC = f"{SERVICE}=tests.security.test_owners_services:touch"
SECRET = "payroll_export"  # a second registered service that nobody here is granted


def touch(params: Any) -> None:
    """The operator's service: writes its parameters to params["path"]."""
    Path(params["path"]).write_text(json.dumps(params), encoding="utf-8")


@dataclass
class Site:
    """A test database, its superuser connection (the operator) and a way to log in as any role."""

    dsn: str
    su: psycopg.Connection[Any]
    pg: Any
    roles: Any

    def role(self, prefix: str, options: str = "LOGIN") -> str:
        return self.roles(prefix, options)

    def dsn_as(self, role: str) -> str:
        return str(self.pg.dsn_for(conninfo_to_dict(self.dsn)["dbname"], user=role))

    def connect(self, role: str) -> psycopg.Connection[Any]:
        return psycopg.connect(self.dsn_as(role), autocommit=True)

    def grant(self, template: str, *names: str) -> None:
        self.su.execute(sql.SQL(template).format(*(sql.Identifier(n) for n in names)))

    def run_docs(self) -> dict[str, Any]:
        """`radixjobs docs run --once` with both services registered, as the operator."""
        done = run_cli("docs", "run", "--once", "--json", "--service", SPEC, "--service", f"{SECRET}=json:dumps",
                       env={"RADIXJOBS_DSN": self.dsn})
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def cron_table(self) -> list[tuple[Any, ...]]:
        return self.su.execute("SELECT num, status, version, props, owner_oid, writer_oid FROM radix.cron_table "
                               "ORDER BY num").fetchall()


@pytest.fixture
def site(db: str, conn: psycopg.Connection[Any], pg: Any, roles: Any) -> Site:
    conn.execute("CREATE FUNCTION public.noop() RETURNS void LANGUAGE sql AS $$ SELECT 1 $$")
    return Site(db, conn, pg, roles)


def csp_doc(num: Any, service: str, marker: Path, **props: Any) -> dict[str, Any]:
    return {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE",
            "props": {"NUM": num, "CSP_SERVICE": service, "CSP_SERVICE_PARAMS": {"path": str(marker)},
                      "INTERVAL": "now() + interval '1 hour'", **props}}


def db_doc(num: Any, **props: Any) -> dict[str, Any]:
    return {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {"NUM": num, "DB_FUNCTION": "noop",
                                                                               **props}}


def refusal(site: Site, role: str, doc: dict[str, Any]) -> DocumentError:
    with site.connect(role) as c, pytest.raises(DocumentError) as refused:
        documents.apply(c, doc)
    return refused.value


def service_problem(service: str, role: str) -> str:
    return (f"NUM 1: permission denied: CSP service '{service}' is not available to RUN_AS role {role} "
            "(the operator grants services: radix.grant_service)")


# -- item 3: who may use a CSP service ------------------------------------------------------------------------------

def test_an_ungranted_role_cannot_use_a_registered_service(site: Site, tmp_path: Path) -> None:
    attacker = site.role("attacker")
    other = site.role("other")
    site.su.execute("SELECT radix.grant_service(%s, %s)", (SECRET, other))
    marker = tmp_path / "pwned"
    before = site.cron_table()
    refused = {name: refusal(site, attacker, csp_doc(1, name, marker)) for name in (SERVICE, SECRET, "unknown_x")}
    for name, error in refused.items():
        assert error.code == "42501"
        assert error.problems == [service_problem(name, attacker)]
    # one text whatever the name: registered, registered and granted to someone else, or unknown
    assert len({str(e).replace(name, "NAME") for name, e in refused.items()}) == 1
    assert not any(SECRET in str(e) for name, e in refused.items() if name != SECRET)
    with site.connect(attacker) as c, pytest.raises(psycopg.errors.InsufficientPrivilege) as raw:
        c.execute("SELECT radix.apply_document(%s)", (Jsonb(csp_doc(1, SERVICE, marker)),))
    assert SECRET not in f"{raw.value} {raw.value.diag.message_detail}"
    assert site.cron_table() == before == []
    site.run_docs()
    assert not marker.exists()


def test_the_refusal_at_run_time_lists_no_service(site: Site, tmp_path: Path) -> None:
    tenant = site.role("tenant")
    site.su.execute("SELECT radix.grant_service('unregistered_x', %s)", (tenant,))
    with site.connect(tenant) as c:
        documents.apply(c, csp_doc(1, "unregistered_x", tmp_path / "m"))
    site.run_docs()
    error = documents.get_document(site.su, 1)["props"]["ERROR_TEXT"]  # type: ignore[index]
    assert error.startswith("CSP service 'unregistered_x' is not registered with this scheduler")
    assert SERVICE not in error
    assert SECRET not in error


def test_a_granted_role_runs_the_service_until_the_grant_is_revoked(site: Site, tmp_path: Path) -> None:
    tenant = site.role("tenant")
    marker = tmp_path / "ran"
    granted = run_cli("docs", "grant-service", SERVICE, tenant, env={"RADIXJOBS_DSN": site.dsn})
    assert granted.returncode == 0, granted.stderr
    with site.connect(tenant) as c:
        assert documents.apply(c, csp_doc(1, SERVICE, marker))[0]["action"] == "created"
    assert site.run_docs()["runs"] == 1
    assert json.loads(marker.read_text(encoding="utf-8")) == {"path": str(marker)}
    marker.unlink()

    revoked = run_cli("docs", "revoke-service", SERVICE, tenant, env={"RADIXJOBS_DSN": site.dsn})
    assert revoked.returncode == 0, revoked.stderr
    assert "revoked" in revoked.stdout
    site.su.execute("UPDATE radix.cron_table SET next_run = clock_timestamp() - interval '1 second'")
    assert site.run_docs()["runs"] == 1
    assert not marker.exists()  # no service code ran
    process = site.su.execute("SELECT status, error_text FROM radix.document_processes WHERE num = '1' "
                              "ORDER BY id DESC LIMIT 1").fetchone()
    assert process == ("failed", "[42501] permission denied: the CSP service is not granted to RUN_AS (redacted)")
    stopped = documents.get_document(site.su, 1)
    assert stopped is not None
    assert stopped["status"] == "CRON_TABLE_PASSIVE"
    assert stopped["props"]["ERROR_TEXT"].startswith(process[1])
    assert SERVICE not in stopped["props"]["ERROR_TEXT"]
    assert tenant not in stopped["props"]["ERROR_TEXT"]
    with site.connect(tenant) as c, pytest.raises(DocumentError) as again:  # and applying it again is refused
        documents.apply(c, csp_doc(1, SERVICE, marker, DESCR="changed"))
    assert again.value.problems == [service_problem(SERVICE, tenant)]


def test_a_grant_to_a_group_follows_the_privileges_of_the_role(site: Site, tmp_path: Path) -> None:
    group = site.role("mailers", "NOLOGIN")
    inherits = site.role("inherits")
    bare = site.role("bare")
    site.grant("GRANT {} TO {} WITH INHERIT TRUE", group, inherits)
    site.grant("GRANT {} TO {} WITH INHERIT FALSE, SET FALSE", group, bare)
    site.su.execute("SELECT radix.grant_service(%s, %s)", (SERVICE, group))
    with site.connect(inherits) as c:
        assert documents.apply(c, csp_doc(2, SERVICE, tmp_path / "a"))[0]["action"] == "created"
    assert refusal(site, bare, csp_doc(1, SERVICE, tmp_path / "b")).problems == [service_problem(SERVICE, bare)]
    # PUBLIC is the operator's explicit choice to let every role use a service
    site.su.execute("SELECT radix.grant_service(%s, 'PUBLIC')", (SERVICE,))
    with site.connect(bare) as c:
        assert documents.apply(c, csp_doc(1, SERVICE, tmp_path / "b"))[0]["action"] == "created"


def test_only_the_operator_grants_and_only_grantees_see_services(site: Site) -> None:
    attacker = site.role("attacker")
    tenant = site.role("tenant")
    site.su.execute("SELECT radix.grant_service(%s, %s)", (SECRET, tenant))
    site.su.execute("SELECT radix.grant_service(%s, %s)", (SERVICE, tenant))
    with site.connect(attacker) as c:
        for statement in ("SELECT radix.grant_service('touch', current_user)",
                          "SELECT radix.revoke_service('touch', %s)",
                          "INSERT INTO radix.service_grants (service, grantee, granted_by) VALUES ('x', 0, 0)",
                          "DELETE FROM radix.service_grants"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(statement.encode(), (tenant,) if "%s" in statement else None)
        with pytest.raises(AdmissionError, match="permission denied"):
            documents.store.grant_service(c, SERVICE, attacker)
        assert documents.store.list_service_grants(c) == []
    with site.connect(tenant) as c:
        assert [g["service"] for g in documents.store.list_service_grants(c)] == [SECRET, SERVICE]
    listed = run_cli("docs", "services", "--json", env={"RADIXJOBS_DSN": site.dsn})  # the operator sees all
    assert listed.returncode == 0, listed.stderr
    assert [(g["service"], g["grantee"]) for g in json.loads(listed.stdout)] == [(SECRET, tenant), (SERVICE, tenant)]
    human = run_cli("docs", "services", env={"RADIXJOBS_DSN": site.dsn})
    assert human.returncode == 0, human.stderr
    assert SECRET in human.stdout
    assert tenant in human.stdout


def test_grant_names_are_checked(site: Site) -> None:
    for service, grantee, error in (("", "PUBLIC", "non-empty"), ("x", "no_such_role_x", "does not exist")):
        with pytest.raises(psycopg.Error, match=error):
            site.su.execute("SELECT radix.grant_service(%s, %s)", (service, grantee))
    bad = run_cli("docs", "grant-service", SERVICE, "no_such_role_x", env={"RADIXJOBS_DSN": site.dsn})
    assert (bad.returncode, bad.stderr) == (1, "radixjobs: error: role no_such_role_x does not exist\n")
    gone = site.role("gone")
    site.su.execute("SELECT radix.grant_service('x', %s)", (gone,))
    site.grant("DROP ROLE {}", gone)
    assert site.su.execute("SELECT count(*) FROM radix.csp_services").fetchone() == (1,)
    site.su.execute("SELECT radix.revoke_service('y', 'PUBLIC')")  # any grant or revoke forgets dropped roles
    assert site.su.execute("SELECT count(*) FROM radix.service_grants").fetchone() == (0,)
    assert site.su.execute("SELECT radix.grant_service('x', 'PUBLIC'), radix.grant_service('x', 'PUBLIC'), "
                           "radix.revoke_service('x', 'public'), radix.revoke_service('x', 'public')"
                           ).fetchone() == (True, False, True, False)


# -- item 11: owning is having the owner's privileges -------------------------------------------------------------

@dataclass
class Victim:
    role: str
    bare: str       # granted the victim WITH INHERIT FALSE, SET FALSE
    inherits: str   # granted the victim WITH INHERIT TRUE, SET FALSE


@pytest.fixture
def victim(site: Site) -> Victim:
    owner = site.role("victim")
    site.grant("CREATE SCHEMA vic AUTHORIZATION {}", owner)
    with site.connect(owner) as c:
        c.execute("CREATE PROCEDURE vic.p() LANGUAGE sql AS $$ SELECT 1 $$")
        catalog.execute_job_ddl(c, f"CREATE JOB vic.nightly SCHEDULE EVERY INTERVAL '1 hour' RUN AS {owner} "
                                   "CALL vic.p()")
        documents.apply(c, db_doc(7, DESCR="the victim's"))
    bare = site.role("bare")
    inherits = site.role("inherits")
    site.grant("GRANT {} TO {} WITH INHERIT FALSE, SET FALSE", owner, bare)
    site.grant("GRANT {} TO {} WITH INHERIT TRUE, SET FALSE", owner, inherits)
    return Victim(owner, bare, inherits)


def _job(site: Site) -> tuple[Any, ...] | None:
    return site.su.execute("SELECT enabled, definition_version FROM radix.jobs WHERE job_name = 'nightly'").fetchone()


@pytest.mark.parametrize("statement", ["ALTER JOB vic.nightly DISABLE", "DROP JOB vic.nightly"])
def test_bare_membership_does_not_own_the_job(site: Site, victim: Victim, statement: str) -> None:
    with site.connect(victim.bare) as c:
        with pytest.raises(AdmissionError, match=r"must be owner of job vic\.nightly") as refused:
            catalog.execute_job_ddl(c, statement)
        assert refused.value.code == "42501"
        assert c.execute("SELECT count(*) FROM radix.job_overview").fetchone() == (0,)
        assert c.execute("SELECT count(*) FROM radix.job_history").fetchone() == (0,)
    assert _job(site) == (True, 1)


def test_bare_membership_does_not_own_the_document(site: Site, victim: Victim) -> None:
    before = site.cron_table()
    error = refusal(site, victim.bare, db_doc(7, DESCR="rewritten", RUN_AS=victim.bare))
    assert error.code == "42501"
    assert error.problems == ["NUM 7: permission denied: document NUM 7 belongs to another role; only a role with "
                              "its owner's privileges may change it"]
    with site.connect(victim.bare) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege) as raw:
            c.execute("SELECT radix.apply_document(%s)", (Jsonb(db_doc(7, RUN_AS=victim.bare)),))
        assert victim.role not in f"{raw.value} {raw.value.diag.message_detail}"
        assert documents.list_documents(c) == []
        assert c.execute("SELECT count(*) FROM radix.document_processes").fetchone() == (0,)
    assert site.cron_table() == before


def test_a_stranger_is_not_told_who_owns_a_num(site: Site, victim: Victim) -> None:
    stranger = site.role("stranger")
    error = refusal(site, stranger, db_doc(7))
    assert victim.role not in str(error)
    assert all(victim.role not in p for p in error.problems)


def test_inherited_privileges_own_the_job_and_the_document(site: Site, victim: Victim) -> None:
    with site.connect(victim.inherits) as c:
        assert [r[0] for r in c.execute("SELECT name FROM radix.job_overview")] == ["vic.nightly"]
        assert catalog.execute_job_ddl(c, "ALTER JOB vic.nightly DISABLE") == "ALTER JOB"
        assert [d["props"]["NUM"] for d in documents.list_documents(c)] == [7]
        # it may rewrite the document, but RUN AS still needs SET: it runs as itself now
        assert documents.apply(c, db_doc(7, RUN_AS=victim.inherits))[0]["action"] == "updated"
    assert _job(site) == (False, 2)
