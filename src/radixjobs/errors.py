"""One exception hierarchy. User errors carry a SQLSTATE-like code and print as one line."""

from __future__ import annotations

from radixjobs.model import SourcePosition


class RadixError(Exception):
    """Base of every error radixjobs raises on purpose; ``str()`` is a complete one-line message."""

    code = "RX000"


class ConfigError(RadixError):
    """Bad configuration: DSN, home directory, options."""

    code = "RX001"


class EmbeddedServerError(RadixError):
    """The embedded PostgreSQL could not be initialised, started or stopped."""

    code = "RX002"


class ConnectError(RadixError):
    """PostgreSQL could not be reached or refused the login."""

    code = "08000"


class SchemaError(RadixError):
    """The radix schema is missing, outdated, or newer than this code."""

    code = "RX003"


class ParseError(RadixError):
    """Job DDL that does not parse; names the problem, the position and the token."""

    code = "42601"

    def __init__(self, message: str, position: SourcePosition | None = None, token: str | None = None):
        self.message = message
        self.position = position
        self.token = token
        where = f" at {position}" if position is not None else ""
        near = f" near {token!r}" if token else ""
        super().__init__(f"syntax error{where}{near}: {message}")


class ScheduleError(RadixError):
    """A schedule value (interval, timestamp, cron expression, time zone) is not acceptable."""

    code = "22007"


class StatementError(RadixError):
    """A statement of a script failed in PostgreSQL (or in job DDL admission)."""

    def __init__(self, number: int, line: int, message: str, sqlstate: str | None = None):
        self.number = number
        self.line = line
        self.sqlstate = sqlstate
        self.code = sqlstate or "RX000"
        state = f" [{sqlstate}]" if sqlstate else ""
        super().__init__(f"statement {number} (line {line}){state}: {message}")


class AdmissionError(RadixError):
    """CREATE/ALTER/DROP JOB refused by the catalog; carries PostgreSQL's SQLSTATE."""

    def __init__(self, message: str, sqlstate: str = "RX000"):
        self.code = sqlstate
        super().__init__(message)
