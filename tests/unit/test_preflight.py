"""preflight.fix_for: the fix named for each login failure, built from radixjobs' own knowledge only."""

from __future__ import annotations

import pytest

from radixjobs import retry
from radixjobs.preflight import Context, fix_for


def context(major: int = 15, client_addr: str | None = "127.0.0.2") -> Context:
    return Context(client_addr, "app", major, "radix_scheduler", True, True, "db.example", "5432",
                   "/home/radixjobs/.pgpass", "radixjobs")


def fix(message: str, major: int = 15, client_addr: str | None = "127.0.0.2") -> str:
    kind = retry.classify(None, message, connection_lost=True).kind
    return fix_for(kind, message, "worker", context(major, client_addr))


def test_a_missing_password_file_line_is_named_exactly() -> None:
    text = fix('connection to server at "db.example" failed: fe_sendauth: no password supplied')
    assert "`db.example:5432:app:worker:<password>`" in text
    assert "/home/radixjobs/.pgpass" in text


@pytest.mark.parametrize(("client_addr", "line"), [
    ("127.0.0.2", "host app worker 127.0.0.2/32 scram-sha-256"),
    (None, "local app worker scram-sha-256"),
])
def test_a_missing_pg_hba_line_is_named_for_where_the_login_comes_from(client_addr: str | None, line: str) -> None:
    text = fix('FATAL:  no pg_hba.conf entry for host "127.0.0.2", user "worker", database "app"',
               client_addr=client_addr)
    assert f"`{line}`" in text


@pytest.mark.parametrize(("major", "group_hint"), [(15, "on PostgreSQL 16+"), (16, "for every member")])
def test_ident_maps_are_named_per_version(major: int, group_hint: str) -> None:
    text = fix('FATAL:  Peer authentication failed for user "worker"', major=major)
    assert "`radix radixjobs worker`" in text
    assert "map=radix" in text
    assert group_hint in text


@pytest.mark.parametrize(("message", "needle"), [
    ('FATAL:  role "worker" is not permitted to log in', "ALTER ROLE worker LOGIN"),
    ('FATAL:  role "worker" does not exist', "does not exist"),
    ('FATAL:  permission denied for database "app"', "GRANT CONNECT ON DATABASE app TO worker"),
    ('FATAL:  password authentication failed for user "worker"', "db.example:5432:app:worker:…"),
])
def test_other_refusals(message: str, needle: str) -> None:
    assert needle in fix(message)


def test_a_refused_login_never_echoes_the_server_message() -> None:
    text = fix('FATAL:  password authentication failed for user "zq-secret-marker"')
    assert "zq-secret-marker" not in text
