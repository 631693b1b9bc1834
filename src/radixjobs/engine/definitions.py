"""What the engine needs to run a job: its definition, the CALL statement, the next planned tick."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any, LiteralString, cast

from psycopg import sql

from radixjobs import schedule
from radixjobs.model import AtSchedule, CronSchedule, EverySchedule, Schedule

LOAD_DEFINITIONS = """
SELECT j.job_id, j.definition_version, j.schema_name, j.job_name, j.principal_name, j.procedure_signature,
       n.nspname AS procedure_schema, p.proname AS procedure_name, j.arguments, j.deadline_ms,
       j.non_atomic, j.schedule_kind, j.interval_ns, j.starting_at_ns, j.at_ns, j.cron_expression,
       j.cron_time_zone
FROM radix.jobs j
LEFT JOIN pg_catalog.pg_proc p ON p.oid = j.procedure_oid
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE j.job_id = ANY(%s)
"""


@dataclass(frozen=True)
class JobDefinition:
    """One version of a job's definition, as the engine runs it."""

    job_id: uuid.UUID
    definition_version: int
    name: str
    principal: str
    signature: str
    call: sql.Composed | None  # None when the procedure no longer exists
    values: tuple[str | None, ...]
    deadline_ms: int
    non_atomic: bool
    schedule: Schedule

    def next_planned_after(self, planned_ns: int, anchor_ns: int) -> int | None:
        """The tick after ``planned_ns`` (None: no further tick, e.g. a one-time job)."""
        if isinstance(self.schedule, AtSchedule):
            return None
        return schedule.next_planned_after(self.schedule, anchor_ns, planned_ns)


def schedule_of(row: dict[str, Any]) -> Schedule:
    if row["schedule_kind"] == "every":
        return EverySchedule(int(row["interval_ns"]), row["starting_at_ns"])
    if row["schedule_kind"] == "at":
        return AtSchedule(int(row["at_ns"]))
    return CronSchedule(str(row["cron_expression"]), str(row["cron_time_zone"]))


def build_call(procedure_schema: str, procedure_name: str,
               arguments: list[dict[str, Any]]) -> tuple[sql.Composed, tuple[str | None, ...]]:
    """``CALL schema.proc($1::type, name => $2::type, …)`` with every value bound, never pasted.

    Types are the catalog's own ``format_type`` output stored at admission (already quoted), so the
    CALL hits exactly the admitted overload or fails; positional arguments come first, as given.
    """
    ordered = sorted(arguments, key=lambda a: (bool(a.get("by_name")), int(a["position"])))
    parts: list[sql.Composable] = []
    for arg in ordered:
        cast_to = sql.SQL(cast(LiteralString, arg["type"]))
        value = sql.SQL("{}::{}").format(sql.Placeholder(), cast_to)
        if arg.get("by_name"):
            value = sql.SQL("{} => {}").format(sql.Identifier(arg["name"]), value)
        parts.append(value)
    call = sql.SQL("CALL {}.{}({})").format(
        sql.Identifier(procedure_schema), sql.Identifier(procedure_name), sql.SQL(", ").join(parts))
    return call, tuple(None if a.get("value") is None else str(a["value"]) for a in ordered)


def definition_from_row(row: dict[str, Any]) -> JobDefinition:
    call: sql.Composed | None = None
    values: tuple[str | None, ...] = ()
    if row["procedure_name"] is not None:
        call, values = build_call(row["procedure_schema"], row["procedure_name"], row["arguments"])
    return JobDefinition(
        job_id=row["job_id"], definition_version=int(row["definition_version"]),
        name=f"{row['schema_name']}.{row['job_name']}", principal=row["principal_name"],
        signature=row["procedure_signature"], call=call, values=values,
        deadline_ms=int(row["deadline_ms"]), non_atomic=bool(row["non_atomic"]), schedule=schedule_of(row))
