"""CRON_TABLE documents, pure: validation, the seed's ``_processTask`` decision table, finish planning.

Validation names EVERY problem of a document (and of a list). The database checks the same rules in
``radix.document_problems`` (sql/routines/documents.sql) with the same texts, so a document written with SQL is
held to them too; keep both in step (tests/integration/test_documents.py compares them). Expressions
are also checked here with pglast, which PostgreSQL does not have: a document written with SQL whose
expression is refused becomes PASSIVE when the expression is first needed.
"""

from __future__ import annotations

import datetime as dt
import enum
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from radixjobs.documents import expression
from radixjobs.errors import RadixError

DOCKIND: Final = "CRON_TABLE"


class Status(enum.StrEnum):
    ACTIVE = "CRON_TABLE_ACTIVE"
    PASSIVE = "CRON_TABLE_PASSIVE"
    ERROR = "CRON_TABLE_ERROR"


DEFINITION_PROPS: Final = ("NUM", "DESCR", "DB_FUNCTION", "CSP_SERVICE", "CSP_SERVICE_PARAMS", "INTERVAL",
                           "INTERVAL_ERROR", "MAX_COUNT_ERROR", "FIRST_RUN", "RUN_AS")
RESERVED_PROPS: Final = ("PERIODICAL_RUN", "DEL_ON_FINISH")
MAINTAINED_PROPS: Final = ("SYS_PROCESS_ID", "COUNT_ERROR", "LAST_RUN", "NEXT_RUN", "DAILY_START_TIME",
                           "DAILY_END_TIME", "ERROR_TEXT")
KNOWN_PROPS: Final = frozenset(DEFINITION_PROPS + RESERVED_PROPS + MAINTAINED_PROPS)
_STATUSES: Final = "CRON_TABLE_ACTIVE, CRON_TABLE_PASSIVE or CRON_TABLE_ERROR"
# A status a document may be given: ACTIVE runs the task; any other CRON_TABLE_<NAME> (CRON_TABLE_DISABLED…)
# disables it, as the seed says. PASSIVE and ERROR are stored as given, any other as PASSIVE (radix._doc_write).
_STATUS: Final = re.compile(r"CRON_TABLE_[A-Z0-9_]+")
_TIMESTAMP: Final = re.compile(
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}([T ][0-9]{2}:[0-9]{2}(:[0-9]{2}(\.[0-9]{1,6})?)?(Z|[+-][0-9]{2}(:?[0-9]{2})?)?)?")
_INTEGER: Final = re.compile(r"-?[0-9]{1,100}")


class DocumentError(RadixError):
    """Documents rejected as a whole; ``problems`` names every one of them."""

    code = "22023"

    def __init__(self, problems: Sequence[str], code: str = "22023"):
        self.problems = list(problems)
        self.code = code
        head = problems[0] if len(problems) == 1 else f"{len(problems)} problems"
        super().__init__(f"CRON_TABLE document rejected: {head}")


def quote_literal(text: str) -> str:
    """PostgreSQL's quote_literal()."""
    body = text.replace("'", "''")
    return f"E'{body.replace(chr(92), chr(92) * 2)}'" if "\\" in text else f"'{body}'"


def _present(props: Mapping[str, Any], key: str) -> bool:
    return props.get(key) is not None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def document_num(doc: Any) -> str | None:
    """The task key: an integer NUM as its digits, a string NUM as given; None when invalid."""
    props = doc.get("props") if isinstance(doc, dict) else None
    num = props.get("NUM") if isinstance(props, dict) else None
    if _is_int(num) and _INTEGER.fullmatch(str(num)):
        return str(num)
    if isinstance(num, str) and num.strip(" ") and len(num) <= 100:
        return num
    return None


def _ident_start(char: str) -> bool:
    return ("a" <= char <= "z") or ("A" <= char <= "Z") or char == "_" or ord(char) >= 0x80


def parse_function_name(text: str) -> tuple[str, ...] | None:
    """``name`` or ``schema.name`` by PostgreSQL's identifier rules (as parse_ident); None if invalid."""
    parts: list[str] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in " \t\n\r\f\v":
            i += 1
        if i < n and text[i] == '"':
            end = i + 1
            part = ""
            while True:
                close = text.find('"', end)
                if close < 0:
                    return None
                part += text[end:close]
                if close + 1 < n and text[close + 1] == '"':
                    part += '"'
                    end = close + 2
                    continue
                i = close + 1
                break
            if not part:
                return None
        elif i < n and _ident_start(text[i]):
            start = i
            while i < n and (_ident_start(text[i]) or text[i] in "0123456789$"):
                i += 1
            part = "".join(c.lower() if "A" <= c <= "Z" else c for c in text[start:i])
        else:
            return None
        parts.append(part)
        while i < n and text[i] in " \t\n\r\f\v":
            i += 1
        if i == n:
            break
        if text[i] != ".":
            return None
        i += 1
    if len(parts) not in (1, 2) or any(len(p.encode()) > 63 for p in parts):
        return None
    return tuple(parts)


def _json_text_ok(text: str) -> bool:
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True


def _timestamp_ok(text: str) -> bool:
    if not _TIMESTAMP.fullmatch(text):
        return False
    try:
        dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    return True


def _not(value: Any) -> str:
    return f", not {quote_literal(value)}" if isinstance(value, str) else ""


def document_problems(doc: Any) -> list[str]:
    """Every structural problem of one document, in radix.document_problems' order and words."""
    if not isinstance(doc, dict):
        return ["a document must be a JSON object"]
    out = [f"unknown key {quote_literal(k)} (a document has dockind, status and props)"
           for k in sorted(doc) if k not in ("dockind", "status", "props")]
    if doc.get("dockind") is None:
        out.append("dockind is missing")
    elif doc["dockind"] != DOCKIND:
        out.append("dockind must be 'CRON_TABLE'" + _not(doc["dockind"]))
    status = doc.get("status")
    if status is None:
        out.append(f"status is missing ({_STATUSES})")
    elif not (isinstance(status, str) and _STATUS.fullmatch(status)):
        out.append(f"status must be {_STATUSES}" + _not(status))
    props = doc.get("props")
    if props is None:
        return [*out, "props is missing"]
    if not isinstance(props, dict):
        return [*out, "props must be a JSON object"]
    return out + _props_problems(doc, props)


def _props_problems(doc: dict[str, Any], props: dict[str, Any]) -> list[str]:
    out = []
    for key in sorted(k for k in props if k not in KNOWN_PROPS):
        upper = "".join(c.upper() if "a" <= c <= "z" else c for c in key)
        hint = f" (property names are upper case: {upper})" if upper in KNOWN_PROPS else ""
        out.append(f"unknown property {quote_literal(key)}{hint}")
    if not _present(props, "NUM"):
        out.append("NUM is missing")
    elif document_num(doc) is None:
        out.append("NUM must be an integer or a non-empty string (at most 100 characters)")
    if _present(props, "DESCR") and not isinstance(props["DESCR"], str):
        out.append("DESCR must be a string")
    out += _target_problems(props)
    for key in ("INTERVAL", "INTERVAL_ERROR"):
        if _present(props, key) and not isinstance(props[key], str):
            out.append(f"{key} must be a string (a SQL expression)")
    limit = props.get("MAX_COUNT_ERROR")
    if limit is not None and not (_is_int(limit) and 0 <= limit <= 2147483647):
        out.append("MAX_COUNT_ERROR must be an integer from 0 to 2147483647")
    first = props.get("FIRST_RUN")
    if first is not None and not (isinstance(first, str) and _timestamp_ok(first)):
        out.append("FIRST_RUN must be an ISO-8601 timestamp such as 2025-01-01T00:00:00" + _not(first))
    run_as = props.get("RUN_AS")
    if run_as is not None and not (isinstance(run_as, str) and run_as.strip(" ")):
        out.append("RUN_AS must be a role name")
    return out


def _target_problems(props: dict[str, Any]) -> list[str]:
    out = []
    has_db, has_csp = _present(props, "DB_FUNCTION"), _present(props, "CSP_SERVICE")
    if not has_db and not has_csp:
        out.append("one of DB_FUNCTION and CSP_SERVICE is required")
    elif has_db and has_csp:
        out.append("DB_FUNCTION and CSP_SERVICE exclude each other: give exactly one")
    function = props.get("DB_FUNCTION")
    if has_db and not isinstance(function, str):
        out.append("DB_FUNCTION must be a string")
    elif isinstance(function, str) and parse_function_name(function) is None:
        out.append(f"DB_FUNCTION must be a function name (name or schema.name), not {quote_literal(function)}")
    service = props.get("CSP_SERVICE")
    if has_csp and not (isinstance(service, str) and service.strip(" ")):
        out.append("CSP_SERVICE must be a non-empty string")
    params = props.get("CSP_SERVICE_PARAMS")
    if params is not None:
        if not has_csp:
            out.append("CSP_SERVICE_PARAMS is only used with CSP_SERVICE")
        if isinstance(params, str) and not _json_text_ok(params):
            out.append("CSP_SERVICE_PARAMS is a string but not valid JSON")
        elif not isinstance(params, str | dict | list):
            out.append("CSP_SERVICE_PARAMS must be a JSON object or array, or a string holding JSON")
    return out


def expression_problems(doc: Any) -> list[str]:
    """INTERVAL / INTERVAL_ERROR refused by the expression checker (empty text is allowed)."""
    props = doc.get("props") if isinstance(doc, dict) else None
    out = []
    for key in ("INTERVAL", "INTERVAL_ERROR"):
        text = props.get(key) if isinstance(props, dict) else None
        if isinstance(text, str) and text.strip():
            try:
                expression.check(text)
            except expression.ExpressionRefused as exc:
                out.append(f"{key} is refused: {exc}")
    return out


def validate(docs: Any) -> list[str]:
    """Every problem of a document or a list of documents (empty: valid), prefixed like the database's."""
    single = not isinstance(docs, list)
    items = [docs] if single else docs
    out = []
    for pos, doc in enumerate(items, 1):
        num = document_num(doc)
        if single:
            prefix = f"NUM {num}: " if num is not None else ""
        else:
            prefix = f"document {pos}" + (f" (NUM {num})" if num is not None else "") + ": "
        out += [prefix + p for p in document_problems(doc) + expression_problems(doc)]
    positions: dict[str, list[int]] = {}
    for pos, doc in enumerate(items, 1):
        num = document_num(doc)
        if num is not None:
            positions.setdefault(num, []).append(pos)
    for num, where in sorted(positions.items(), key=lambda kv: kv[1][0]):
        if len(where) > 1:
            out.append(f"NUM {num} appears more than once (documents {', '.join(map(str, where))})")
    return out


# -- the decision table (the seed's _processTask) -------------------------------------------------------


class Action(enum.StrEnum):
    SKIP = "skip"              # NEXT_RUN is in the future
    RUN = "run"                # due, nothing running: start a process
    RERUN = "rerun"            # the recorded process is gone, or its node died: start again
    FINISH_ERROR = "finish_error"
    FINISH_OK = "finish_ok"
    WAIT = "wait"              # the process still runs


@dataclass(frozen=True)
class ProcessState:
    """The recorded system process as the decision sees it (``live``: running on a live node)."""

    status: str
    live: bool
    error_text: str | None = None


def process_task(now: dt.datetime, due_at: dt.datetime | None, sys_process_id: int | None,
                 process: ProcessState | None) -> Action:
    """What to do with an ACTIVE task, in the seed's order (plus: running on a dead node → rerun)."""
    if due_at is not None and due_at > now:
        return Action.SKIP
    if sys_process_id is None:
        return Action.RUN
    if process is None:
        return Action.RERUN
    if process.status == "failed":
        return Action.FINISH_ERROR
    if process.status == "completed":
        return Action.FINISH_OK
    if not process.live:
        return Action.RERUN
    return Action.WAIT


# -- what the runner reads and starts --------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One row of radix.doc_candidates."""

    num: str
    version: int
    due_at: dt.datetime | None
    sys_process_id: int | None
    process: ProcessState | None
    now: dt.datetime


@dataclass(frozen=True)
class Started:
    """A process radix.doc_start created."""

    process_id: int
    kind: str
    target: str
    params: Any
    principal: str
    refusal: str | None
    started_at: dt.datetime
    version: int


# -- finishing a run (the seed's _finishTask) -----------------------------------------------------------


@dataclass(frozen=True)
class FinishPlan:
    """What a finished run does before its next time is known."""

    count_error: int
    status: Status                 # ERROR when the limit is reached, else ACTIVE (pending the expression)
    expression_name: str | None    # INTERVAL / INTERVAL_ERROR to evaluate; None: no next time needed
    expression_text: str
    error_text: str | None


def plan_finish(props: Mapping[str, Any], count_error: int, error: str | None) -> FinishPlan:
    """Error counting and the choice of expression; COUNT_ERROR reaching MAX_COUNT_ERROR → ERROR."""
    if error is None:
        return FinishPlan(0, Status.ACTIVE, "INTERVAL", props.get("INTERVAL") or "", None)
    count = count_error + 1
    limit = props.get("MAX_COUNT_ERROR")
    if isinstance(limit, int) and count >= limit:
        return FinishPlan(count, Status.ERROR, None, "",
                          f"{error} (COUNT_ERROR {count} reached MAX_COUNT_ERROR {limit}: the task is stopped)")
    name = "INTERVAL_ERROR" if (props.get("INTERVAL_ERROR") or "").strip() else "INTERVAL"
    return FinishPlan(count, Status.ACTIVE, name, props.get(name) or "", error)


RUN_AS_REFUSED: Final = "cannot evaluate as RUN_AS"


def may_pass(reason: str | None) -> bool:
    """Is this reason for having no next time one that may pass by itself? RUN_AS cannot log in (NOLOGIN,
    radix._doc_refusal's text): the run is an error like any other, counted towards MAX_COUNT_ERROR, and the
    task is tried again later. A revoked grant or a dropped role is a decision: PASSIVE at once."""
    return reason is not None and reason.startswith(RUN_AS_REFUSED) and reason.endswith("cannot log in")


@dataclass(frozen=True)
class Settlement:
    """The finish's writes: status (applied only while ACTIVE), NEXT_RUN and ERROR_TEXT."""

    status: Status
    next_run: dt.datetime | None
    error_text: str | None


def settle(plan: FinishPlan, ended_at: dt.datetime, next_time: dt.datetime | None,
           reason: str | None, *, retry_at: dt.datetime | None = None) -> Settlement:
    """Combine the plan with the evaluated next time (or the reason there is none).

    The next time must be after the run's end (``ended_at``, the "now" the expression saw): ``NOW()`` is
    not a schedule. ``retry_at``: the reason may pass (RUN_AS cannot be used now): the task stays ACTIVE
    and is tried again then; its failed run was counted, so MAX_COUNT_ERROR still stops it."""
    if plan.expression_name is None:
        return Settlement(plan.status, None, plan.error_text)
    name = plan.expression_name
    if reason is None and next_time is None:
        reason = "the value is NULL"
    if reason is None and next_time is not None and next_time <= ended_at:
        reason = f"the value {next_time.isoformat()} is not after the run's end {ended_at.isoformat()}"
    if reason is None:
        return Settlement(Status.ACTIVE, next_time, plan.error_text)
    if retry_at is not None:
        why = f"{name}: {reason}; tried again at {retry_at.isoformat()}"
        return Settlement(Status.ACTIVE, retry_at, why if plan.error_text is None else f"{plan.error_text}; {why}")
    why = f"{name}: {reason}; the task is now passive"
    return Settlement(Status.PASSIVE, None, why if plan.error_text is None else f"{plan.error_text}; {why}")


def empty_expression_reason(plan: FinishPlan) -> str | None:
    """The reason for an empty expression (no INTERVAL: the task ran once), or None."""
    if plan.expression_name is not None and not plan.expression_text.strip():
        return "the expression is empty (no INTERVAL: the task ran once)"
    return None
