"""Where to connect: ``--dsn`` / ``RADIXJOBS_DSN``, else libpq ``PG*`` variables, else the embedded server.

An invalid DSN is one line; when the DSN carries a password, the text libpq quotes from it is left out.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from radixjobs.config_exposure import holds_password
from radixjobs.embedded import EmbeddedServer
from radixjobs.errors import ConfigError

# libpq reads these itself; any of them set means "the user configured a server".
LIBPQ_VARIABLES = ("PGHOST", "PGHOSTADDR", "PGPORT", "PGDATABASE", "PGUSER", "PGSERVICE")


def resolve_dsn(dsn: str | None = None) -> str | None:
    """The DSN to use, ``""`` for libpq's environment, or None for the embedded server."""
    if dsn is None:
        dsn = os.environ.get("RADIXJOBS_DSN") or None
    if dsn is not None:
        try:
            psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            message = str(exc).splitlines()[0]
            if holds_password(dsn):  # libpq quotes the text it stopped at: a piece of the password, maybe
                message = re.sub(r'"[^"]*"', lambda m: m[0] if m[0] == '"="' else '"…"', message)
            raise ConfigError(f"invalid DSN: {message}") from None
        return dsn
    if any(os.environ.get(name) for name in LIBPQ_VARIABLES):
        return ""
    return None


@dataclass
class Target:
    """A database to talk to; ``embedded`` is set when it is the embedded server's."""

    dsn: str
    embedded: EmbeddedServer | None = None


@contextlib.contextmanager
def open_target(dsn: str | None = None, home: Path | None = None, *, persistent: bool = False,
                settings: dict[str, str] | None = None) -> Iterator[Target]:
    """Yield a target; an embedded server started here is stopped on exit unless ``persistent``."""
    resolved = resolve_dsn(dsn)
    if resolved is not None:
        yield Target(resolved)
        return
    server = EmbeddedServer(home, settings=settings)
    info, _ = server.ensure_running(persistent=persistent)
    try:
        yield Target(info.dsn(), server)
    finally:
        server.release()
