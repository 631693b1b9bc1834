"""Which config-file values are secrets, and which modes and owners expose them (radixjobs.config_exposure)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import pytest

from radixjobs.cli import cli
from radixjobs.config_exposure import holds_password, judge, secrets_in
from radixjobs.config_file import keys_of

PATH = Path("/etc/radixjobs/radixjobs.toml")
SERVE_OPTIONS = keys_of(cli.commands["serve"])


@pytest.mark.parametrize(("text", "held"), [
    ("host=/run/postgresql dbname=app user=radixjobs", False),
    ("host=db password=s3cret", True),
    ("host=db sslpassword=s3cret", True),
    ("host=db password=''", False),
    ("postgresql://u:s3cret@db/app", True),
    ("postgres://u@db/app?password=s3cret", True),
    ("postgresql://u:@db/app", False),
    ("postgresql://u@db/app", False),
    ("host=db password=two words", True),  # libpq cannot read it: judged by its spelling
    ("postgresql://u:s3cret@db/app?bogus=1", True),
    ("127.0.0.1:7317", False),
    ("export=myapp.exports:run", False),
])
def test_a_password_in_any_spelling_of_a_connection_string(text: str, held: bool) -> None:
    assert holds_password(text) is held


def test_the_keys_that_hold_secrets() -> None:
    document: dict[str, Any] = {"dsn": ["host=a", "host=b password=x"], "http-token": "t" * 16, "http": "127.0.0.1:1",
                                "service": ["a=m:f"], "node-id": "n"}
    assert {key: s.what for key, s in secrets_in(document).items()} == {"dsn": "a password", "http-token": "a token"}
    assert secrets_in({"dsn": "host=a", "http-token": ""}) == {}


def _status(mode: int, uid: int = 1000, gid: int = 1000) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 0, 0, 1, uid, gid, 0, 0, 0, 0))


@pytest.mark.parametrize(("mode", "uid", "outcome"), [
    (0o600, 1000, None),
    (0o400, 1000, None),
    (0o640, 0, None),          # root's file its group may only read: the packaged layout
    (0o640, 1000, "warned"),
    (0o660, 0, "warned"),      # its group may change it too: not the packaged layout
    (0o604, 1000, "refused"),
    (0o644, 0, "refused"),
])
def test_modes_and_owners(mode: int, uid: int, outcome: str | None) -> None:
    exposure = judge(PATH, _status(mode, uid), {"dsn": "host=db password=s3cret"}, SERVE_OPTIONS)
    assert (None if exposure is None else "refused" if exposure.refused else "warned") == outcome
    if exposure is not None:
        assert f"(mode {mode:04o}): chmod 600 {PATH}" in exposure.message
        assert "s3cret" not in exposure.message


def test_a_file_without_secrets_is_not_judged() -> None:
    assert judge(PATH, _status(0o666), {"dsn": "host=db", "http": "127.0.0.1:1"}, SERVE_OPTIONS) is None


def test_the_fix_names_where_each_secret_can_be_kept_instead() -> None:
    exposure = judge(PATH, _status(0o644), {"dsn": ["host=a", "host=b password=x"], "http-token": "t" * 16},
                     SERVE_OPTIONS)
    assert exposure is not None
    assert exposure.message == (
        f"config file {PATH}: holds a password (key 'dsn') and a token (key 'http-token') and every user may "
        f"read it (mode 0644): chmod 600 {PATH}, or keep passwords in a password file (passfile=, PGPASSFILE or "
        "~/.pgpass, mode 0600) and 'http-token' in RADIXJOBS_HTTP_TOKEN instead")
