"""Secrets in a ``--config`` file, and who besides its owner may read it.

Invariants:
- A secret is a non-empty value of a key named for one (its name ends in ``token``, ``password`` or ``secret``:
  ``http-token``), or a string, alone or in a list, that carries a password as a libpq connection string:
  ``password=`` / ``sslpassword=`` keywords, a URI's ``user:password@`` or its ``?password=``. Every entry of a
  list counts (``dsn = [...]``: every cluster), and so does a string libpq cannot read. The file's own text is
  judged, whatever the command line overrides. A key added later is covered by these rules without edits here.
- Who may read it comes from the mode and owner of the file as it was opened and read, never from a second
  look by name. Judged as libpq judges a key file: readable by others is refused; readable by its group is
  warned about, except a file owned by root that its group may only read (``root:radixjobs 0640``, the layout
  of docs/deploy.md), which is the way a daemon that is not root reads a file it may not change.
- A message names the file, its mode, the keys and the fix, never a value.
- Not judged where file modes mean nothing (not POSIX), as libpq does.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import click
import psycopg
from psycopg.conninfo import conninfo_to_dict

SECRET_NAME = re.compile(r"(token|password|secret)$")
PASSWORD_KEYWORDS = ("password", "sslpassword")
PASSWORD_KEYWORD = re.compile(r"(?:^|\s)(?:ssl)?password\s*=", re.IGNORECASE)
URI_SCHEMES = ("postgres", "postgresql")


@dataclass(frozen=True)
class Exposure:
    """A file holding secrets that others may read: ``refused`` when every user may."""

    refused: bool
    message: str


def holds_password(text: str) -> bool:
    """Whether ``text``, read as a libpq connection string or URI, carries a password."""
    try:
        params = conninfo_to_dict(text)
    except (psycopg.Error, ValueError):  # not one libpq reads: judged by its spelling
        return _spells_password(text)
    return any(params.get(keyword) for keyword in PASSWORD_KEYWORDS)


def _spells_password(text: str) -> bool:
    if PASSWORD_KEYWORD.search(text):
        return True
    if "://" not in text:
        return False
    try:
        parts = urlsplit(text)
        password = parts.password
    except ValueError:
        return "@" in text  # a URI with user info that does not parse: assume the worst
    query = parse_qs(parts.query)
    return parts.scheme.lower() in URI_SCHEMES and bool(password or any(query.get(k) for k in PASSWORD_KEYWORDS))


@dataclass(frozen=True)
class Secret:
    what: str  # "a password", "a token", …
    in_dsn: bool  # a connection string's password (kept in a password file instead)


def secrets_in(document: Mapping[str, Any]) -> dict[str, Secret]:
    """The keys of the file that hold a secret, in the file's order."""
    found: dict[str, Secret] = {}
    for key, value in document.items():
        items = value if isinstance(value, list) else [value]
        if any(isinstance(item, str) and holds_password(item) for item in items):
            found[key] = Secret("a password", True)
        elif (named := SECRET_NAME.search(key.lower())) and any(item not in (None, "", False) for item in items):
            found[key] = Secret(f"a {named[1]}", False)
    return found


def judge(path: Path, status: os.stat_result, document: Mapping[str, Any],
          options: Mapping[str, click.Option]) -> Exposure | None:
    """Whether the file, with this mode and owner, exposes the secrets it holds; None when it does not."""
    if os.name != "posix":
        return None
    mode = stat.S_IMODE(status.st_mode)
    if not mode & (stat.S_IRGRP | stat.S_IROTH):
        return None
    secrets = secrets_in(document)
    if not secrets:
        return None
    if not mode & stat.S_IROTH and status.st_uid == 0 and not mode & (stat.S_IWGRP | stat.S_IXGRP):
        return None  # root's file that the daemon's group may only read
    held = " and ".join(f"{secret.what} (key '{key}')" for key, secret in secrets.items())
    fix = f"chmod 600 {path}{_instead(secrets, options)}"
    if mode & stat.S_IROTH:
        return Exposure(True, f"config file {path}: holds {held} and every user may read it (mode {mode:04o}): "
                              f"{fix}")
    group = _group_name(status.st_gid)
    return Exposure(False, f"config file {path} holds {held} and the group {group} may read it (mode {mode:04o}): "
                           f"{fix}, or chown root {path} if the group is the daemon's alone")


def _instead(secrets: Mapping[str, Secret], options: Mapping[str, click.Option]) -> str:
    """Where else each secret can be kept: a password file, or the option's environment variable."""
    places = []
    if any(secret.in_dsn for secret in secrets.values()):
        places.append("passwords in a password file (passfile=, PGPASSFILE or ~/.pgpass, mode 0600)")
    for key, secret in secrets.items():
        envvar = getattr(options.get(key), "envvar", None)
        if not secret.in_dsn and isinstance(envvar, str):
            places.append(f"'{key}' in {envvar}")
    return f", or keep {' and '.join(places)} instead" if places else ""


def _group_name(gid: int) -> str:
    import grp  # POSIX only, as judge()

    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)
