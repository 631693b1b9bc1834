"""pg_cron rows to radixjobs job definitions — pure: text in, a plan or a reason out, no I/O.

Invariants:

- A row becomes a plan only when its meaning carries over: its schedule is a 5-field cron expression (or a
  macro with a 5-field equivalent) or ``'N seconds'``, and its command can run inside a procedure. Anything
  else is an ``Unmappable`` with a one-line reason, never a job that behaves differently.
- The command is either one ``CALL schema.proc(constants)``, mapped to the job's own CALL (resolved and
  converted at admission, as CREATE JOB does), or wrapped: a plpgsql body running each statement in order,
  in one transaction, with the principal's own search_path, as pg_cron runs it. Plain statements go through
  ``EXECUTE`` of a dollar-quoted string whose tag the text does not contain; ``CALL`` stays a plpgsql CALL
  so a procedure that commits keeps working.
- Names are deterministic for a given ``cron.job`` table, so a second import finds the jobs of the first.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pglast import ast, parse_sql
from pglast.enums.parsenodes import AlterTableType, ReindexObjectType, TransactionStmtKind
from pglast.parser import ParseError as SqlParseError
from pglast.stream import RawStream

from radixjobs import ddl
from radixjobs import schedule as sched
from radixjobs.errors import ParseError, ScheduleError
from radixjobs.model import CallArgument, CreateJob, CronSchedule, EverySchedule, QualifiedName, Schedule

NS_PER_SECOND = 1_000_000_000
MAX_NAME_BYTES = 63
Action = Literal["created", "would create", "exists", "skipped", "unmapped", "refused"]


class Unmappable(Exception):
    """A pg_cron row (or part of it) with no faithful radixjobs equivalent; the message says why."""


@dataclass(frozen=True)
class CronJobRow:
    """One row of pg_cron's ``cron.job`` (older versions lack ``jobname`` and ``active``)."""

    jobid: int
    schedule: str
    command: str
    nodename: str | None = "localhost"
    nodeport: int | None = None
    database: str | None = None
    username: str | None = None
    active: bool = True
    jobname: str | None = None

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> CronJobRow:
        """A row from ``to_jsonb(cron.job)``: missing columns take pg_cron's defaults."""
        active = rec.get("active")
        port = rec.get("nodeport")
        return cls(int(rec["jobid"]), str(rec.get("schedule") or ""), str(rec.get("command") or ""),
                   rec.get("nodename"), int(port) if port is not None else None, rec.get("database"),
                   rec.get("username"), True if active is None else bool(active), rec.get("jobname"))


@dataclass(frozen=True)
class Outcome:
    """What the import did with one pg_cron row."""

    jobid: int
    jobname: str | None
    job: str | None
    action: Action
    reason: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class CommandPlan:
    """How the command runs: a direct CALL (``procedure`` and ``arguments``) or a wrapper ``body``."""

    procedure: QualifiedName | None = None
    arguments: tuple[CallArgument, ...] = ()
    body: str | None = None
    note: str = ""


@dataclass(frozen=True)
class JobPlan:
    """A radixjobs job for one pg_cron row; ``command.body`` set: a wrapper procedure named like the job."""

    row: CronJobRow
    name: QualifiedName
    schedule: Schedule
    principal: str
    command: CommandPlan

    def outcome(self, action: Action, reason: str) -> Outcome:
        return Outcome(self.row.jobid, self.row.jobname, str(self.name), action, reason)

    def describe(self) -> str:
        """The schedule and what the job will CALL, in one line."""
        if isinstance(self.schedule, EverySchedule):
            when = f"EVERY '{self.schedule.interval_ns // NS_PER_SECOND} seconds'"
        elif isinstance(self.schedule, CronSchedule):
            when = f"CRON '{self.schedule.expression}' TIME ZONE '{self.schedule.time_zone}'"
        else:
            when = "AT"
        if self.command.body is not None:
            return f"{when}, wraps the command in {self.name}(){self.command.note}"
        args = ", ".join(_describe_argument(a) for a in self.command.arguments)
        return f"{when}, CALL {self.command.procedure}({args}){self.command.note}"


# ------------------------------------------------------------------------------------------------ schedule

_SECONDS = re.compile(r"^\s*(\d+)\s*seconds?\s*$", re.IGNORECASE)
_MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
           "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


def map_schedule(text: str, time_zone: str) -> Schedule:
    """pg_cron's schedule as a radixjobs schedule; Unmappable says why there is none."""
    seconds = _SECONDS.match(text)
    if seconds:
        count = int(seconds.group(1))
        if count < 1:
            raise Unmappable(f"schedule '{text}': an interval must be at least 1 second")
        return EverySchedule(count * NS_PER_SECOND)
    expression = " ".join(text.split())
    lowered = expression.lower()
    if lowered == "@reboot":
        raise Unmappable("schedule '@reboot' (run at server start) has no radixjobs equivalent")
    expression = _MACROS.get(lowered, expression)
    if "$" in expression:
        raise Unmappable(f"schedule '{text}': '$' (last day of the month) has no radixjobs equivalent")
    if len(expression.split()) != 5:
        raise Unmappable(f"schedule '{text}': pg_cron takes 5 cron fields or 'N seconds'")
    try:
        sched.validate_cron(expression, time_zone)
    except ScheduleError as exc:
        raise Unmappable(str(exc)) from None
    return CronSchedule(expression, time_zone)


# ------------------------------------------------------------------------------------------------- command

_TXN_ENVELOPE_BEGIN = (TransactionStmtKind.TRANS_STMT_BEGIN, TransactionStmtKind.TRANS_STMT_START)
_TXN_ENVELOPE_END = (TransactionStmtKind.TRANS_STMT_COMMIT,)


def map_command(command: str) -> CommandPlan:
    """The command as a direct CALL or a wrapper body; Unmappable when it cannot run in a procedure."""
    try:
        raw = list(parse_sql(command))
    except SqlParseError as exc:
        raise Unmappable(f"command is not valid SQL: {exc}") from None
    statements = [(r.stmt, _slice(command, r.stmt_location or 0, r.stmt_len or 0))
                  for r in raw if r.stmt is not None]
    note = ""
    if _is_envelope(statements):
        statements = statements[1:-1]
        note = " (its BEGIN/COMMIT dropped: one attempt is one transaction)"
    if not statements:
        raise Unmappable("the command is empty")
    for node, _text in statements:
        reason = not_in_procedure(node)
        if reason:
            raise Unmappable(reason)
    if len(statements) == 1 and isinstance(statements[0][0], ast.CallStmt):
        direct = _direct_call(statements[0][1])
        if isinstance(direct, CommandPlan):
            return CommandPlan(direct.procedure, direct.arguments, note=note)
        note = f" (not a direct CALL: {direct})" + note
    return CommandPlan(body=wrapper_body(statements), note=note)


def _slice(text: str, location: int, length: int) -> str:
    return (text[location:location + length] if length else text[location:]).strip()


def _is_envelope(statements: Sequence[tuple[ast.Node, str]]) -> bool:
    """BEGIN; … COMMIT; around statements with no other transaction control and no BEGIN options."""
    if len(statements) < 2:
        return False
    first, last = statements[0][0], statements[-1][0]
    return (isinstance(first, ast.TransactionStmt) and first.kind in _TXN_ENVELOPE_BEGIN and not first.options
            and isinstance(last, ast.TransactionStmt) and last.kind in _TXN_ENVELOPE_END and not last.chain
            and not any(isinstance(node, ast.TransactionStmt) for node, _ in statements[1:-1]))


def _direct_call(text: str) -> CommandPlan | str:
    """``CALL schema.proc(constants)`` through radixjobs' own DDL parser; else why not (a short reason)."""
    probe = f"CREATE JOB radix_import.job SCHEDULE EVERY INTERVAL '1 second' RUN AS radix_import {text}"
    try:
        stmt = ddl.parse_job_statement(probe)
    except ParseError as exc:
        return exc.message
    if not isinstance(stmt, CreateJob):
        return "not a CALL"
    return CommandPlan(stmt.procedure, stmt.arguments)


def not_in_procedure(node: ast.Node) -> str | None:
    """Why a statement cannot run inside a procedure's transaction (None: it can)."""
    what = _NEVER_IN_TRANSACTION.get(type(node).__name__)
    if what:
        return f"{what} cannot run inside a transaction block, so not in a procedure"
    if isinstance(node, ast.VacuumStmt) and node.is_vacuumcmd:
        return "VACUUM cannot run inside a procedure (leave it to autovacuum, a CSP service or vacuumdb)"
    if isinstance(node, ast.TransactionStmt):
        return "transaction control (BEGIN, COMMIT, SAVEPOINT, …) in the command cannot run inside a procedure"
    if isinstance(node, ast.IndexStmt) and node.concurrent:
        return "CREATE INDEX CONCURRENTLY cannot run inside a transaction block, so not in a procedure"
    if isinstance(node, ast.DropStmt) and node.concurrent:
        return "DROP INDEX CONCURRENTLY cannot run inside a transaction block, so not in a procedure"
    if isinstance(node, ast.ReindexStmt):
        return _reindex_reason(node)
    if isinstance(node, ast.ClusterStmt) and node.relation is None:
        return "CLUSTER without a table cannot run inside a transaction block, so not in a procedure"
    if isinstance(node, ast.AlterTableStmt) and any(_detach_concurrently(cmd) for cmd in node.cmds or ()):
        return "DETACH PARTITION CONCURRENTLY cannot run inside a transaction block, so not in a procedure"
    if isinstance(node, ast.AlterDatabaseStmt) and any(
            isinstance(o, ast.DefElem) and o.defname == "tablespace" for o in node.options or ()):
        return "ALTER DATABASE … SET TABLESPACE cannot run inside a transaction block, so not in a procedure"
    if isinstance(node, ast.DiscardStmt):
        return "DISCARD cannot run inside a procedure"
    if isinstance(node, ast.CopyStmt) and node.filename is None and not node.is_program:
        return "COPY FROM STDIN / TO STDOUT needs a client, which a job does not have"
    if isinstance(node, ast.SelectStmt) and node.intoClause is not None:
        return "SELECT … INTO a new table cannot run in a procedure: write CREATE TABLE … AS instead"
    return None


_NEVER_IN_TRANSACTION = {
    "CreatedbStmt": "CREATE DATABASE", "DropdbStmt": "DROP DATABASE", "AlterSystemStmt": "ALTER SYSTEM",
    "CreateTableSpaceStmt": "CREATE TABLESPACE", "DropTableSpaceStmt": "DROP TABLESPACE",
    "CreateSubscriptionStmt": "CREATE SUBSCRIPTION", "DropSubscriptionStmt": "DROP SUBSCRIPTION",
    "AlterSubscriptionStmt": "ALTER SUBSCRIPTION",
}


def _reindex_reason(node: ast.ReindexStmt) -> str | None:
    concurrent = any(isinstance(p, ast.DefElem) and p.defname == "concurrently" for p in node.params or ())
    if concurrent:
        return "REINDEX CONCURRENTLY cannot run inside a transaction block, so not in a procedure"
    if node.kind in (ReindexObjectType.REINDEX_OBJECT_DATABASE, ReindexObjectType.REINDEX_OBJECT_SYSTEM):
        return "REINDEX DATABASE / SYSTEM cannot run inside a transaction block, so not in a procedure"
    return None


def _detach_concurrently(cmd: Any) -> bool:
    return (isinstance(cmd, ast.AlterTableCmd) and cmd.subtype == AlterTableType.AT_DetachPartition
            and isinstance(cmd.def_, ast.PartitionCmd) and bool(cmd.def_.concurrent))


def wrapper_body(statements: Iterable[tuple[ast.Node, str]]) -> str:
    """A plpgsql body running each statement in order: CALL as itself, the rest through EXECUTE."""
    lines = ["BEGIN"]
    for node, text in statements:
        if isinstance(node, ast.CallStmt):
            lines.append(f"    {RawStream()(node)};")
        else:
            tag = dollar_tag(text)
            lines.append(f"    EXECUTE ${tag}${text}${tag}$;")
    lines.append("END")
    return "\n".join(lines) + "\n"


def dollar_tag(text: str, base: str = "cmd") -> str:
    """A dollar-quote tag that cannot end a quote early: the text contains the tag nowhere."""
    tag, n = base, 0
    while tag in text:
        n += 1
        tag = f"{base}{n}"
    return tag


# --------------------------------------------------------------------------------------------------- names


def job_names(rows: Iterable[CronJobRow]) -> dict[int, str]:
    """A job name per pg_cron jobid: its sanitised ``jobname`` or ``pg_cron_<jobid>``; names two rows would
    share get ``_<jobid>`` appended, so every name is unique and stable."""
    base = {row.jobid: sanitise_name(row.jobname) or f"pg_cron_{row.jobid}" for row in rows}
    counts = Counter(base.values())
    out = {}
    for jobid, name in base.items():
        if counts[name] > 1:
            suffix = f"_{jobid}"
            name = name[:MAX_NAME_BYTES - len(suffix)] + suffix
        out[jobid] = name
    return out


def sanitise_name(jobname: str | None) -> str | None:
    """``jobname`` as a plain lower-case identifier (a–z, 0–9, _), at most 63 bytes; None when nothing is
    left of it."""
    if not jobname:
        return None
    name = re.sub(r"[^a-z0-9_]+", "_", jobname.lower()).strip("_")
    name = re.sub(r"_{2,}", "_", name)
    if not name:
        return None
    if name[0].isdigit():
        name = f"job_{name}"
    return name[:MAX_NAME_BYTES].rstrip("_")


def _describe_argument(arg: CallArgument) -> str:
    value = arg.value
    text = "NULL" if value.value is None else (f"'{value.value}'" if value.kind in ("string", "typed")
                                               else value.value)
    if value.kind == "array":
        text = "ARRAY[…]"
    elif value.type_name:
        text = f"{text}::{value.type_name}"
    return f"{arg.name} => {text}" if arg.name else text
