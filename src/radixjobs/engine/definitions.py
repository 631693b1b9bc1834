"""What the engine needs to run a job: its definition, the CALL statement, the next planned tick.

Invariants:
- Definitions are cached by (job, version); an attempt whose version is not cached runs under the definition
  loaded now (``load_definition``): a job re-armed since its claim is fenced anyway (its lease is gone, and
  radix.begin_attempt refuses it), a renamed one runs. Every change of a job bumps its version (the state's
  too), so a tick found after ``ALTER JOB … SET (batch = off)`` is judged by the new definition.
- The CALL names the admitted procedure with quoted identifiers and reads every value on the server, cast
  to its admitted type (``build_call``, ``build_tick_call``): no value is ever part of the text.
- The cache of definitions is bounded by count and by estimated bytes (``DefinitionCache``), however many
  jobs a node runs and however large their arguments.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import secrets
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, LiteralString

from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from radixjobs import schedule
from radixjobs.model import AfterSchedule, AtSchedule, CronSchedule, EverySchedule, Schedule

# What a cached definition costs beyond its texts (the objects, the schedule, the cache's own entry).
DEFINITION_OVERHEAD_BYTES = 1024

LOAD_DEFINITIONS = """
SELECT j.job_id, j.definition_version, j.schema_name, j.job_name, j.principal_name, j.procedure_signature,
       n.nspname AS procedure_schema, p.proname AS procedure_name, j.arguments, j.deadline_ms,
       j.non_atomic, j.schedule_kind, j.interval_ns, j.starting_at_ns, j.at_ns, j.cron_expression,
       j.cron_time_zone, j.max_attempts, j.owner_name, j.batch_ticks
FROM radix.jobs j
LEFT JOIN pg_catalog.pg_proc p ON p.oid = j.procedure_oid
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
WHERE j.job_id = ANY(%s)
"""

# The claim (node, how many, with cron ticks, the per-principal cap, the lease in seconds, leaving the
# one-transaction ticks to radix.find_ticks, the long-attempt threshold in ms, how many long ones it may
# take, and the principals this node served, least recently first: see radix.claim_due), and in the same
# round trip the definition of each claimed job (built only when the cache lacks that version; arguments
# come as text, parsed only then), then its principal's oid. ROWS on radix.claim_due keeps this a
# nested loop over the jobs' primary key however many jobs there are.
CLAIM = """
SELECT c.job_id, c.definition_version, c.lease_token, c.planned_ns, c.attempt, c.idempotency_key, c.resumed,
       c.coalesced, c.anchor_ns, c.run_kind,
       j.definition_version, j.schema_name, j.job_name, j.principal_name, j.procedure_signature,
       n.nspname, p.proname, j.arguments::text, j.deadline_ms, j.non_atomic, j.schedule_kind, j.interval_ns,
       j.starting_at_ns, j.at_ns, j.cron_expression, j.cron_time_zone, j.max_attempts, j.owner_name,
       j.batch_ticks, j.principal_oid
FROM radix.claim_due(%s::pg_catalog.text, %s::pg_catalog.int4, %s::pg_catalog.bool, %s::pg_catalog.int4,
                     %s::pg_catalog.int4, true, %s::pg_catalog.int4, %s::pg_catalog.int4,
                     %s::pg_catalog.oid[]) c
JOIN radix.jobs j ON j.job_id = c.job_id
LEFT JOIN pg_catalog.pg_proc p ON p.oid = j.procedure_oid
LEFT JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
"""
CLAIM_COLUMNS = 10  # the Claim's fields; the definition's columns follow
DEFINITION_COLUMNS = ("definition_version", "schema_name", "job_name", "principal_name", "procedure_signature",
                      "procedure_schema", "procedure_name", "arguments", "deadline_ms", "non_atomic",
                      "schedule_kind", "interval_ns", "starting_at_ns", "at_ns", "cron_expression",
                      "cron_time_zone", "max_attempts", "owner_name", "batch_ticks")
CLAIM_DEADLINE = CLAIM_COLUMNS + DEFINITION_COLUMNS.index("deadline_ms")  # a claim row's job timeout (ms) …
CLAIM_PRINCIPAL = CLAIM_COLUMNS + len(DEFINITION_COLUMNS)  # … and its principal's oid


@dataclass(frozen=True)
class JobDefinition:
    """One version of a job's definition, as the engine runs it."""

    job_id: uuid.UUID
    definition_version: int
    name: str
    principal: str
    signature: str
    call: bytes | None  # the DO block with the CALL, rendered once (see build_call); None: procedure gone
    deadline_ms: int
    non_atomic: bool
    schedule: Schedule
    max_attempts: int = 5  # WITH (max_attempts = N): attempts per tick, retries included
    owner: str = ""  # the job's owner (ticks batch only with their owner's: engine/batches.py)
    tick_call: bytes | None = None  # the CALL alone, as a tick runs it, alone or in a batch (build_tick_call)
    batch: bool = False  # WITH (batch = on): its owner lets its ticks share a transaction (engine/batches.py)

    def next_planned_after(self, planned_ns: int, anchor_ns: int) -> int | None:
        """The tick after ``planned_ns`` (None: no further tick, e.g. a one-time job)."""
        if isinstance(self.schedule, AtSchedule | AfterSchedule):
            return None
        return schedule.next_planned_after(self.schedule, anchor_ns, planned_ns)

    @functools.cached_property
    def tick_call_constant(self) -> str:
        """``tick_call`` as a dollar-quoted string constant, made once per definition (engine/ticks.py and
        engine/batches.py put it in every tick's query)."""
        assert self.tick_call is not None
        return dollar_quoted(self.tick_call.decode(), "radix_call")

    @property
    def size_bytes(self) -> int:
        """An estimate of the memory this definition holds: its texts plus a fixed overhead."""
        texts = (self.name, self.principal, self.signature)
        # the tick call counted twice: its text and its quoted constant, once a tick has run
        return (DEFINITION_OVERHEAD_BYTES + len(self.call or b"") + 2 * len(self.tick_call or b"")
                + sum(len(t) for t in texts))


def schedule_of(row: dict[str, Any]) -> Schedule:
    if row["schedule_kind"] == "every":
        return EverySchedule(int(row["interval_ns"]), row["starting_at_ns"])
    if row["schedule_kind"] == "at":
        return AtSchedule(int(row["at_ns"]))
    if row["schedule_kind"] == "after":
        return AfterSchedule()
    return CronSchedule(str(row["cron_expression"]), str(row["cron_time_zone"]))


def dollar_quoted(text: str, prefix: str) -> LiteralString:
    """``text`` as a dollar-quoted string constant whose tag does not occur in it.

    The lexer ends the constant at the first occurrence of its tag, so the tag is checked against the
    text followed by the closing tag (a text ending in ``$radix`` must not complete it early). Dollar
    quoting means the same whatever the session's standard_conforming_strings or backslash_quote. The
    result is one complete string constant, safe to compose into SQL (hence LiteralString).
    """
    while True:
        tag = f"${prefix}_{secrets.token_hex(8)}$"
        if (text + tag).find(tag) == len(text):
            return tag + text + tag


def _identifier(name: str) -> str:
    """``name`` as a quoted identifier, always quoted (as psycopg's sql.Identifier renders it)."""
    return '"' + name.replace('"', '""') + '"'


# Where a CALL's arguments come from: the stored arguments (radix.jobs.arguments, a JSON array) read on the
# server, never a value in the query text (pg_stat_activity shows that text to every session of the role).
# A DO block (a lease attempt) reads them from the setting its begin made (attempt.py, from
# radix.current_arguments), a tick's CALL, alone or in a batch, from run_tick's or run_ticks' EXECUTE … USING
# (radix.start_tick, radix.start_ticks).
ARGUMENTS = "pg_catalog.current_setting('radix.arguments')::pg_catalog.jsonb"
TICK_ARGUMENTS = "$1"


def _call_arguments(arguments: list[dict[str, Any]], source: str) -> list[tuple[str, str, str | None]]:
    """Each argument as (its stored type, its value read from ``source`` and cast to that type, its quoted
    name or None when positional): positional arguments first, as given. The value is element ``i`` of the
    stored array, by index (``jsonb_extract_path_text``, schema-qualified: the principal's search_path is
    live), so the text names no value."""
    ordered = sorted(enumerate(arguments), key=lambda e: (bool(e[1].get("by_name")), int(e[1]["position"])))
    rendered: list[tuple[str, str, str | None]] = []
    for index, arg in ordered:
        type_name = str(arg["type"])
        value = f"pg_catalog.jsonb_extract_path_text({source}, '{index}', 'value')"
        rendered.append((type_name, f"CAST({value} AS {type_name})",
                         _identifier(arg["name"]) if arg.get("by_name") else None))
    return rendered


def build_call(procedure_schema: str, procedure_name: str, arguments: list[dict[str, Any]],
               stored: str) -> bytes:
    """A ``DO`` block that CALLs ``schema.proc(…)`` with each argument in a variable of its stored type.

    A CALL with OUT/INOUT parameters returns a row, and libpq reads a row whole into the client's memory
    (a procedure may return 1 GB in it); PL/pgSQL keeps it on the server, in the block's variables. A
    top-level DO is non-atomic, so a procedure may still COMMIT when the attempt runs non-atomically.
    The values are read on the server from ``stored``, an expression of the stored arguments (the engine's:
    ``ARGUMENTS``, the setting the attempt's begin made), each cast to its stored type, so the type's input
    function reads it, as ``$1::type`` with an untyped parameter did. Types are the catalog's own
    ``format_type`` output stored at admission (already quoted), so the CALL hits exactly the admitted
    overload or fails; positional arguments come first, as given. Identifiers are always quoted. Built with
    plain string operations: one is built per job definition loaded, and psycopg's sql composition cost
    several times more (a burst of 10,000 new jobs spent a fifth of the daemon's CPU in it).
    """
    declarations: list[str] = []
    parts: list[str] = []
    # each variable's expression reads the setting itself: one expression fewer to plan in a block compiled
    # afresh at every run than a variable holding the arguments
    for number, (type_name, value, name) in enumerate(_call_arguments(arguments, f"({stored})"), 1):
        variable = f'"radix_argument_{number}"'
        declarations.append(f"{variable} {type_name} := {value};")
        parts.append(f"{name} => {variable}" if name else variable)
    block = (f"DECLARE {' '.join(declarations)} BEGIN CALL {_identifier(procedure_schema)}."
             f"{_identifier(procedure_name)}({', '.join(parts)}); END")
    return ("DO " + dollar_quoted(block, "radix_do")).encode()  # one SQL: no tuple to unpack


def build_tick_call(procedure_schema: str, procedure_name: str, arguments: list[dict[str, Any]]) -> bytes:
    """The same CALL as build_call's, without the DO block, its arguments read from ``$1``: what a tick runs,
    alone or in a batch (radix.run_tick, radix.run_ticks: EXECUTE … USING the tick's stored arguments, which
    keeps an OUT row on the server too, in an atomic context as every tick is). A DO block is compiled
    afresh each time it runs (docs/hot-path.md)."""
    parts = [f"{name} => {value}" if name else value
             for _, value, name in _call_arguments(arguments, TICK_ARGUMENTS)]
    return (f"CALL {_identifier(procedure_schema)}.{_identifier(procedure_name)}({', '.join(parts)})").encode()


def definition_from_row(row: dict[str, Any]) -> JobDefinition:
    call: bytes | None = None
    tick_call: bytes | None = None
    if row["procedure_name"] is not None:
        arguments = row["arguments"]
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        call = build_call(row["procedure_schema"], row["procedure_name"], arguments, ARGUMENTS)
        tick_call = build_tick_call(row["procedure_schema"], row["procedure_name"], arguments)
    return JobDefinition(
        job_id=row["job_id"], definition_version=int(row["definition_version"]),
        name=f"{row['schema_name']}.{row['job_name']}", principal=row["principal_name"],
        signature=row["procedure_signature"], call=call,
        deadline_ms=int(row["deadline_ms"]), non_atomic=bool(row["non_atomic"]), schedule=schedule_of(row),
        max_attempts=int(row["max_attempts"]), owner=str(row.get("owner_name") or ""), tick_call=tick_call,
        batch=bool(row.get("batch_ticks")))


class DefinitionCache:
    """Definitions by (job, version), least recently used dropped first beyond ``size`` entries or beyond
    ``max_bytes`` of their estimated size (JobDefinition.size_bytes), so memory stays bounded however many
    jobs a node runs and however large their arguments (at most radix.max_argument_bytes() each). A
    definition larger than ``max_bytes`` alone is not kept (nor does it push others out); the attempt
    holding it still runs."""

    def __init__(self, size: int, max_bytes: int):
        self.size = size
        self.max_bytes = max_bytes
        self.total_bytes = 0
        self._entries: OrderedDict[tuple[uuid.UUID, int], JobDefinition] = OrderedDict()

    def __contains__(self, key: tuple[uuid.UUID, int]) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: tuple[uuid.UUID, int]) -> JobDefinition | None:
        job = self._entries.get(key)
        if job is not None:
            self._entries.move_to_end(key)
        return job

    def put(self, job: JobDefinition) -> None:
        key = (job.job_id, job.definition_version)
        previous = self._entries.pop(key, None)
        if previous is not None:
            self.total_bytes -= previous.size_bytes
        if job.size_bytes > self.max_bytes:
            return
        self._entries[key] = job
        self.total_bytes += job.size_bytes
        while self._entries and (len(self._entries) > self.size or self.total_bytes > self.max_bytes):
            _, dropped = self._entries.popitem(last=False)
            self.total_bytes -= dropped.size_bytes

    def remember_claimed(self, claim_row: tuple[Any, ...]) -> None:
        """Cache the definition that came with a claim row (see CLAIM), unless cached or of another version."""
        job_id, version = claim_row[0], claim_row[1]
        if claim_row[CLAIM_COLUMNS] == version and (job_id, version) not in self._entries:
            columns = claim_row[CLAIM_COLUMNS:CLAIM_PRINCIPAL]
            self.put(definition_from_row({"job_id": job_id, **dict(zip(DEFINITION_COLUMNS, columns, strict=True))}))


async def load_definition(pool: AsyncConnectionPool[Any], cache: DefinitionCache, job_id: uuid.UUID,
                          version: int) -> JobDefinition | None:
    """The definition an attempt runs under (from ``cache``, else loaded and cached); None when the job was
    dropped."""
    job = cache.get((job_id, version))
    if job is None:
        async with pool.connection() as conn, conn.cursor(row_factory=dict_row) as cur:
            await cur.execute(LOAD_DEFINITIONS, ([job_id],))
            row = await cur.fetchone()
        if row is None:
            return None
        # a newer version than the claim's (ALTER since the claim) runs as the claim was made: a
        # re-armed job's lease is gone (begin_attempt refuses), a renamed one's is not
        job = definition_from_row(row)
        cache.put(job)
    return job


# An on_failure hook's procedure (sql/routines/hooks.sql), looked up when a hook's claim runs: hooks are rare,
# so neither the claim's query nor the cache carries it.
LOAD_HOOK = """
SELECT n.nspname, p.proname, j.on_failure_signature
FROM radix.jobs j
JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) j.on_failure_oid
JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) p.pronamespace
WHERE j.job_id OPERATOR(pg_catalog.=) %s::pg_catalog.uuid
"""
HOOK_KIND = "on_failure"  # the claim's run_kind of a hook's attempt
# The hook's one argument, the failure document: radix.current_arguments hands it to a hook's attempt.
HOOK_ARGUMENTS: list[dict[str, Any]] = [{"type": "jsonb", "position": 1}]


async def load_hook(pool: AsyncConnectionPool[Any], job: JobDefinition) -> JobDefinition:
    """The definition a hook's attempt runs under: the job's (principal, timeout, max_attempts), CALLing its
    on_failure procedure with the failure document, always tried atomically first. Its call is None when the
    job has no hook now (RESET since the hook was queued): the attempt then fails as a procedure gone does."""
    async with pool.connection() as conn:
        row = await (await conn.execute(LOAD_HOOK, (job.job_id,))).fetchone()
    if row is None:
        return dataclasses.replace(job, call=None, tick_call=None, non_atomic=False, batch=False)
    return dataclasses.replace(job, signature=str(row[2]), call=build_call(row[0], row[1], HOOK_ARGUMENTS, ARGUMENTS),
                               tick_call=None, non_atomic=False, batch=False)
