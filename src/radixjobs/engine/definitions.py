"""What the engine needs to run a job: its definition, the CALL statement, the next planned tick."""

from __future__ import annotations

import json
import uuid
from collections import OrderedDict
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

# The claim (node, how many, with cron ticks, the per-principal cap: see radix.claim_due), and in the same
# round trip the definition of each claimed job (built only when the cache lacks that version; arguments
# come as text, parsed only then). ROWS on radix.claim_due keeps this a
# nested loop over the jobs' primary key however many jobs there are.
CLAIM = """
SELECT c.job_id, c.definition_version, c.lease_token, c.planned_ns, c.attempt, c.idempotency_key, c.resumed,
       c.coalesced, c.anchor_ns,
       j.definition_version, j.schema_name, j.job_name, j.principal_name, j.procedure_signature,
       n.nspname, p.proname, j.arguments::text, j.deadline_ms, j.non_atomic, j.schedule_kind, j.interval_ns,
       j.starting_at_ns, j.at_ns, j.cron_expression, j.cron_time_zone
FROM radix.claim_due(%s::pg_catalog.text, %s::pg_catalog.int4, %s::pg_catalog.bool, %s::pg_catalog.int4) c
JOIN radix.jobs j ON j.job_id = c.job_id
LEFT JOIN pg_catalog.pg_proc p ON p.oid = j.procedure_oid
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
"""
CLAIM_COLUMNS = 9  # the Claim's fields; the definition's columns follow
DEFINITION_COLUMNS = ("definition_version", "schema_name", "job_name", "principal_name", "procedure_signature",
                      "procedure_schema", "procedure_name", "arguments", "deadline_ms", "non_atomic",
                      "schedule_kind", "interval_ns", "starting_at_ns", "at_ns", "cron_expression",
                      "cron_time_zone")


@dataclass(frozen=True)
class JobDefinition:
    """One version of a job's definition, as the engine runs it."""

    job_id: uuid.UUID
    definition_version: int
    name: str
    principal: str
    signature: str
    call: bytes | None  # the CALL, rendered once (psycopg then reuses its parse); None: procedure gone
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
    call: bytes | None = None
    values: tuple[str | None, ...] = ()
    if row["procedure_name"] is not None:
        arguments = row["arguments"]
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        composed, values = build_call(row["procedure_schema"], row["procedure_name"], arguments)
        call = composed.as_bytes(None)  # identifiers quoted by psycopg; values stay bound parameters
    return JobDefinition(
        job_id=row["job_id"], definition_version=int(row["definition_version"]),
        name=f"{row['schema_name']}.{row['job_name']}", principal=row["principal_name"],
        signature=row["procedure_signature"], call=call, values=values,
        deadline_ms=int(row["deadline_ms"]), non_atomic=bool(row["non_atomic"]), schedule=schedule_of(row))


class DefinitionCache:
    """Definitions by (job, version); beyond ``size`` entries the least recently used is dropped, so memory
    stays bounded however many jobs a node runs."""

    def __init__(self, size: int):
        self.size = size
        self._entries: OrderedDict[tuple[uuid.UUID, int], JobDefinition] = OrderedDict()

    def __contains__(self, key: tuple[uuid.UUID, int]) -> bool:
        return key in self._entries

    def get(self, key: tuple[uuid.UUID, int]) -> JobDefinition | None:
        job = self._entries.get(key)
        if job is not None:
            self._entries.move_to_end(key)
        return job

    def put(self, job: JobDefinition) -> None:
        self._entries[(job.job_id, job.definition_version)] = job
        self._entries.move_to_end((job.job_id, job.definition_version))
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def remember_claimed(self, claim_row: tuple[Any, ...]) -> None:
        """Cache the definition that came with a claim row (see CLAIM), unless cached or of another version."""
        job_id, version = claim_row[0], claim_row[1]
        if claim_row[CLAIM_COLUMNS] == version and (job_id, version) not in self._entries:
            self.put(definition_from_row({"job_id": job_id, **dict(zip(DEFINITION_COLUMNS,
                                                                          claim_row[CLAIM_COLUMNS:], strict=True))}))
