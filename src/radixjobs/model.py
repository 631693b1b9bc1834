"""Domain values shared by the parser, the catalog and the engine: frozen, no I/O."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Literal


def quote_ident(name: str) -> str:
    """Quote an identifier the way PostgreSQL's quote_ident does (only when needed)."""
    if name and (name[0].isalpha() or name[0] == "_") and name.islower() and all(
        c.isalnum() or c in "_$" for c in name
    ) and name.isascii():
        return name
    return '"' + name.replace('"', '""') + '"'


# The statuses an attempt has in radix.job_history.
HISTORY_STATUSES = ("running", "succeeded", "retrying", "failed", "lease_lost", "released", "missed")


@dataclass(frozen=True)
class QualifiedName:
    """A schema-qualified object name, already case-folded per PostgreSQL rules."""

    schema: str
    name: str

    def __str__(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"


@dataclass(frozen=True)
class EverySchedule:
    """Ticks on the grid anchor + k*interval; the anchor is STARTING AT or the (re-)enable time."""

    interval_ns: int
    starting_at_ns: int | None = None
    kind: Literal["every"] = "every"


@dataclass(frozen=True)
class AtSchedule:
    """One tick at a fixed UTC instant."""

    at_ns: int
    kind: Literal["at"] = "at"


@dataclass(frozen=True)
class CronSchedule:
    """Ticks of a 5- or 6-field cron expression, in an IANA time zone."""

    expression: str
    time_zone: str = "UTC"
    kind: Literal["cron"] = "cron"


Condition = Literal["succeeds", "fails", "completes"]


@dataclass(frozen=True)
class Upstream:
    """One edge of an AFTER schedule: the upstream job and how its tick must end."""

    job: QualifiedName
    on: Condition = "succeeds"


@dataclass(frozen=True)
class AfterSchedule:
    """No clock of its own: one tick per upstream tick that ended as named (every upstream's, with AND), with
    that tick's planned time. The upstreams are stored as edges (radix.job_edges); the engine needs none."""

    upstreams: tuple[Upstream, ...] = ()
    kind: Literal["after"] = "after"


Schedule = EverySchedule | AtSchedule | CronSchedule | AfterSchedule


ConstantKind = Literal["integer", "numeric", "string", "boolean", "null", "typed", "array"]


@dataclass(frozen=True)
class Constant:
    """An immutable, catalog-serialisable argument constant as written in the DDL.

    integer/numeric: ``value`` is the literal's text, sign included ("-5", "1.25e3").
    string: ``value`` is the string's content (escapes resolved).
    boolean: ``value`` is "true" or "false".  null: ``value`` is None.
    typed: ``INTERVAL '1 day'``, ``'x'::date``, ``CAST(1 AS bigint)``: ``value`` is the inner
    literal's text (None for a typed NULL) and ``type_name`` the type as written, folded.
    array: ``ARRAY[...]`` of constants in ``elements``.
    """

    kind: ConstantKind
    value: str | None = None
    type_name: str | None = None
    elements: tuple[Constant, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The structured form the database's admission function takes (never SQL text)."""
        out: dict[str, Any] = {"kind": self.kind, "value": self.value}
        if self.type_name is not None:
            out["type"] = self.type_name
        if self.kind == "array":
            out["elements"] = [e.to_json() for e in self.elements]
        return out


@dataclass(frozen=True)
class CallArgument:
    """One argument of the CALL clause: positional when ``name`` is None."""

    value: Constant
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, **self.value.to_json()}


@dataclass(frozen=True)
class CreateJob:
    name: QualifiedName
    schedule: Schedule
    principal: str
    procedure: QualifiedName
    arguments: tuple[CallArgument, ...] = ()
    enabled: bool = True
    if_not_exists: bool = False
    timeout_ms: int | None = None  # WITH (timeout = '...'); None: the default (240 s)
    options: tuple[tuple[str, str | int], ...] = ()  # WITH (...) other than timeout, checked (JobOptions)
    or_replace: bool = False  # CREATE OR REPLACE JOB

    def options_json(self) -> dict[str, str | int]:
        """The admission function's options document (the timeout in milliseconds)."""
        out: dict[str, str | int] = dict(self.options)
        if self.timeout_ms is not None:
            out["timeout"] = self.timeout_ms
        return out


@dataclass(frozen=True)
class AlterJob:
    """ALTER JOB: every field that is not None (or empty) is a change."""

    name: QualifiedName
    enabled: bool | None = None
    schedule: Schedule | None = None  # SET SCHEDULE
    principal: str | None = None  # SET RUN AS
    procedure: QualifiedName | None = None  # SET CALL, with ``arguments``
    arguments: tuple[CallArgument, ...] = ()
    options: tuple[tuple[str, str | int], ...] = ()  # SET (...); a timeout in milliseconds
    reset: tuple[str, ...] = ()  # RESET (...)
    rename_to: QualifiedName | None = None  # RENAME TO


@dataclass(frozen=True)
class RunJob:
    """RUN JOB name: one attempt now; with a range (FOR RANGE TIMESTAMP a TO TIMESTAMP b), a backfill."""

    name: QualifiedName
    range_from_ns: int | None = None
    range_to_ns: int | None = None


@dataclass(frozen=True)
class DropJob:
    name: QualifiedName
    if_exists: bool = False
    cascade: bool = False


@dataclass(frozen=True)
class CreateJobGroup:
    """CREATE JOB GROUP [IF NOT EXISTS] name WITH (max_running = N): a group name is one identifier."""

    name: str
    max_running: int
    if_not_exists: bool = False


@dataclass(frozen=True)
class AlterJobGroup:
    """ALTER JOB GROUP name SET (max_running = N), or RESET (max_running) (``max_running`` None)."""

    name: str
    max_running: int | None


@dataclass(frozen=True)
class DropJobGroup:
    name: str
    if_exists: bool = False


GroupStatement = CreateJobGroup | AlterJobGroup | DropJobGroup
JobStatement = CreateJob | AlterJob | DropJob | RunJob | GroupStatement


class JobStatus(enum.StrEnum):
    SCHEDULED = "scheduled"
    RUNNING = "running"
    RETRY_WAIT = "retry_wait"
    COMPLETE = "complete"
    FAILED = "failed"
    DISABLED = "disabled"


@dataclass(frozen=True)
class SourcePosition:
    """1-based line and column of a token in the statement text."""

    line: int
    column: int

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}"


@dataclass(frozen=True)
class ScriptStatement:
    """One statement cut from a script, with where it starts in the script."""

    text: str
    number: int
    line: int
