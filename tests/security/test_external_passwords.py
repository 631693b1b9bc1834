"""PGPASSWORD in the daemon's environment is the scheduler's own password: it is never offered for a
principal's login (libpq would offer it to any role without a password of its own in the DSN).

Attacked through the real path on a distribution PostgreSQL with scram passwords (tests/external.py):
a principal whose password *is* the scheduler's, absent from the password file, must not log in.
"""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from psycopg import sql

from radixjobs.engine.principals import principal_dsn
from tests.acceptance.test_external_cluster import effects, history, job, radix
from tests.external import SCHEDULER, ExternalDb


def same_password_principal(db: ExternalDb) -> str:
    """A principal whose password is the scheduler's, not listed in the password file."""
    principal = db.role("ext_twin", in_passfile=False)
    with db.admin() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(
            sql.Identifier(principal), sql.Literal(db.cluster.passwords[SCHEDULER])))
    return principal


def test_pgpassword_is_not_offered_for_a_principal_login(ext: ExternalDb, monkeypatch: pytest.MonkeyPatch) -> None:
    principal = same_password_principal(ext)
    monkeypatch.setenv("PGPASSWORD", ext.cluster.passwords[SCHEDULER])
    monkeypatch.setenv("PGPASSFILE", str(ext.cluster.passfile))
    with psycopg.connect(ext.dsn(password=False)) as conn:  # PGPASSWORD does log the scheduler in
        assert conn.info.user == SCHEDULER

    async def login() -> None:
        conn = await psycopg.AsyncConnection.connect(principal_dsn(ext.dsn(password=False), principal))
        await conn.close()

    with pytest.raises(psycopg.OperationalError, match="no password supplied"):
        asyncio.run(login())


def test_a_job_of_that_principal_fails_as_no_password_and_never_runs(ext: ExternalDb) -> None:
    principal = same_password_principal(ext)
    name = job(ext, principal)
    ran = radix(ext, "run", "--once", "--json")
    assert ran.returncode == 0, ran.stderr
    [attempt] = history(ext, name)
    assert (attempt["status"], attempt["error"]["kind"]) == ("failed", "no_password")
    assert effects(ext) == []
    checked = radix(ext, "check", "--json")
    assert checked.returncode == 1
    assert [p["kind"] for p in json.loads(checked.stdout)["principals"]] == ["no_password"]


def test_the_scheduler_password_in_the_dsn_is_not_carried_over(ext: ExternalDb) -> None:
    principal = same_password_principal(ext)
    dsn = principal_dsn(ext.dsn(), principal)
    assert ext.cluster.passwords[SCHEDULER] not in dsn
