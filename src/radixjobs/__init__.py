"""radixjobs: a durable, SQL-native job scheduler for PostgreSQL."""

from radixjobs.config import open_target, resolve_dsn
from radixjobs.embedded import EmbeddedServer
from radixjobs.errors import (
    AdmissionError,
    ConfigError,
    ConnectError,
    ParseError,
    RadixError,
    ScheduleError,
    SchemaError,
    StatementError,
)
from radixjobs.migrate import check_ready, code_version, install

__all__ = [
    "AdmissionError",
    "ConfigError",
    "ConnectError",
    "EmbeddedServer",
    "ParseError",
    "RadixError",
    "ScheduleError",
    "SchemaError",
    "StatementError",
    "check_ready",
    "code_version",
    "install",
    "open_target",
    "resolve_dsn",
]
