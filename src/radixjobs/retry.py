"""Classify a failed attempt and decide whether to retry it (SPEC §5): pure, no I/O.

Classification is driven by tables: an exact SQLSTATE first, then its two-character class, then the
flags the engine knows from its own bookkeeping (deadline passed, cancel requested, connection lost)
and, for connect failures without a SQLSTATE, the message.

Decision on lost connections: **retryable**. When the connection drops before the outcome of the
attempt is known, PostgreSQL rolls the attempt's transaction back (an in-doubt COMMIT is resolved by
the engine with ``pg_xact_status`` before it classifies), and the retry reuses the tick's idempotency
key, so the tick stays at-least-once and is never silently skipped.  Authentication failures are not
connection failures: they are ``security`` and terminal — libpq's own "no password supplied" (the
password file has no line for the principal) included, so a refused login costs one attempt per tick, and
its record carries a fixed text saying what to fix (never the server's message).
"""

from __future__ import annotations

import enum
import re
import uuid
from dataclasses import dataclass
from typing import Any, Final

MAX_ATTEMPTS: Final = 5
BACKOFF_BASE_NS: Final = 100_000_000  # 100 ms
BACKOFF_CAP_NS: Final = 10_000_000_000  # 10 s
MAX_MESSAGE_CHARS: Final = 2_000
ERROR_CODE: Final = "PL_JOB_ATTEMPT_FAILED"


class Category(enum.StrEnum):
    CONFLICT = "conflict"
    DEADLINE = "deadline"
    CANCELLATION = "cancellation"
    CONNECTION = "connection"
    SECURITY = "security"
    UNDEFINED_OBJECT = "undefined_object"
    DATA = "data"
    RAISED_EXCEPTION = "raised_exception"
    INTERNAL = "internal"


RETRYABLE_CATEGORIES: Final = frozenset(
    {Category.CONFLICT, Category.DEADLINE, Category.CANCELLATION, Category.CONNECTION}
)


@dataclass(frozen=True)
class Cause:
    """Why an attempt failed: a stable ``kind`` (a SQLSTATE condition name or ours) and its category."""

    kind: str
    category: Category
    retryable: bool


def _cause(kind: str, category: Category) -> Cause:
    return Cause(kind, category, category in RETRYABLE_CATEGORIES)


_C = Category
# Exact SQLSTATE -> (kind, category).  57014 and 57P01 also depend on the flags (see classify).
_BY_SQLSTATE: Final[dict[str, tuple[str, Category]]] = {
    "40001": ("serialization_failure", _C.CONFLICT),
    "40P01": ("deadlock_detected", _C.CONFLICT),
    "55P03": ("lock_not_available", _C.CONFLICT),
    "57014": ("query_canceled", _C.CANCELLATION),
    "25P03": ("idle_in_transaction_session_timeout", _C.DEADLINE),
    "25P04": ("transaction_timeout", _C.DEADLINE),
    "57P05": ("idle_session_timeout", _C.DEADLINE),
    "57P01": ("admin_shutdown", _C.CONNECTION),
    "57P02": ("crash_shutdown", _C.CONNECTION),
    "57P03": ("cannot_connect_now", _C.CONNECTION),
    "57P04": ("database_dropped", _C.CONNECTION),
    "53300": ("too_many_connections", _C.CONNECTION),
    "08000": ("connection_exception", _C.CONNECTION),
    "08001": ("sqlclient_unable_to_establish_sqlconnection", _C.CONNECTION),
    "08003": ("connection_does_not_exist", _C.CONNECTION),
    "08004": ("sqlserver_rejected_establishment_of_sqlconnection", _C.CONNECTION),
    "08006": ("connection_failure", _C.CONNECTION),
    "08007": ("transaction_resolution_unknown", _C.CONNECTION),
    "08P01": ("protocol_violation", _C.CONNECTION),
    "42501": ("insufficient_privilege", _C.SECURITY),
    "28000": ("invalid_authorization_specification", _C.SECURITY),
    "28P01": ("invalid_password", _C.SECURITY),
    "0L000": ("invalid_grantor", _C.SECURITY),
    "0LP01": ("invalid_grant_operation", _C.SECURITY),
    "0P000": ("invalid_role_specification", _C.SECURITY),
    "42883": ("undefined_function", _C.UNDEFINED_OBJECT),
    "42725": ("ambiguous_function", _C.UNDEFINED_OBJECT),
    "42704": ("undefined_object", _C.UNDEFINED_OBJECT),
    "42P01": ("undefined_table", _C.UNDEFINED_OBJECT),
    "42703": ("undefined_column", _C.UNDEFINED_OBJECT),
    "3F000": ("invalid_schema_name", _C.UNDEFINED_OBJECT),
    "3D000": ("invalid_catalog_name", _C.UNDEFINED_OBJECT),
    "22000": ("data_exception", _C.DATA),
    "22001": ("string_data_right_truncation", _C.DATA),
    "22003": ("numeric_value_out_of_range", _C.DATA),
    "22004": ("null_value_not_allowed", _C.DATA),
    "22007": ("invalid_datetime_format", _C.DATA),
    "22008": ("datetime_field_overflow", _C.DATA),
    "22009": ("invalid_time_zone_displacement_value", _C.DATA),
    "22011": ("substring_error", _C.DATA),
    "22012": ("division_by_zero", _C.DATA),
    "22015": ("interval_field_overflow", _C.DATA),
    "22019": ("invalid_escape_character", _C.DATA),
    "2201B": ("invalid_regular_expression", _C.DATA),
    "2202E": ("array_subscript_error", _C.DATA),
    "22021": ("character_not_in_repertoire", _C.DATA),
    "22023": ("invalid_parameter_value", _C.DATA),
    "22026": ("string_data_length_mismatch", _C.DATA),
    "22P02": ("invalid_text_representation", _C.DATA),
    "22P05": ("untranslatable_character", _C.DATA),
    "22032": ("invalid_json_text", _C.DATA),
    "23000": ("integrity_constraint_violation", _C.DATA),
    "23001": ("restrict_violation", _C.DATA),
    "23502": ("not_null_violation", _C.DATA),
    "23503": ("foreign_key_violation", _C.DATA),
    "23505": ("unique_violation", _C.DATA),
    "23514": ("check_violation", _C.DATA),
    "23P01": ("exclusion_violation", _C.DATA),
    "P0000": ("plpgsql_error", _C.RAISED_EXCEPTION),
    "P0001": ("raise_exception", _C.RAISED_EXCEPTION),
    "P0002": ("no_data_found", _C.RAISED_EXCEPTION),
    "P0003": ("too_many_rows", _C.RAISED_EXCEPTION),
    "P0004": ("assert_failure", _C.RAISED_EXCEPTION),
    "2D000": ("invalid_transaction_termination", _C.INTERNAL),
    "XX000": ("internal_error", _C.INTERNAL),
    "XX001": ("data_corrupted", _C.INTERNAL),
    "XX002": ("index_corrupted", _C.INTERNAL),
}

# SQLSTATE class -> (kind, category) for codes of that class missing from _BY_SQLSTATE.
_BY_CLASS: Final[dict[str, tuple[str, Category]]] = {
    "08": ("connection_exception", _C.CONNECTION),
    "28": ("invalid_authorization_specification", _C.SECURITY),
    "22": ("data_exception", _C.DATA),
    "23": ("integrity_constraint_violation", _C.DATA),
    "P0": ("plpgsql_error", _C.RAISED_EXCEPTION),
}

# Every class PostgreSQL itself uses (errcodes.txt).  A well-formed SQLSTATE outside them can only come
# from user code (RAISE … USING ERRCODE 'RX001'), so it is a raised exception; unknown codes inside them
# are internal.
_POSTGRES_CLASSES: Final = frozenset(
    {
        "00", "01", "02", "03", "08", "09", "0A", "0B", "0F", "0L", "0P", "0Z", "20", "21", "22",
        "23", "24", "25", "26", "27", "28", "2B", "2D", "2F", "34", "38", "39", "3B", "3D", "3F",
        "40", "42", "44", "53", "54", "55", "57", "58", "72", "F0", "HV", "P0", "XX",
    }
)
_SQLSTATE_SHAPE: Final = re.compile(r"[0-9A-Z]{5}")

# Connect failures reach us as OperationalError without a SQLSTATE; only the message says why.
_CONNECT_SECURITY_MESSAGES: Final[tuple[tuple[re.Pattern[str], str], ...]] = (
    (re.compile(r"authentication", re.IGNORECASE), "authentication_failed"),
    (re.compile(r"pg_hba\.conf", re.IGNORECASE), "authentication_failed"),
    # libpq's own: the server asked for a password and none was found (the password file lacks the role)
    (re.compile(r"no password supplied", re.IGNORECASE), "no_password"),
    (re.compile(r"not permitted to log in", re.IGNORECASE), "login_not_permitted"),
    (re.compile(r"permission denied for database", re.IGNORECASE), "connect_privilege"),
)
_ROLE_WORD = re.compile(r"\brole\b", re.IGNORECASE)
_DOES_NOT_EXIST = "does not exist"
_STATEMENT_TIMEOUT = re.compile(r"statement timeout", re.IGNORECASE)
_USER_REQUEST = re.compile(r"user request", re.IGNORECASE)

_INTERNAL = ("internal_error", _C.INTERNAL)
_USER_DEFINED = ("user_defined_exception", _C.RAISED_EXCEPTION)
_DEADLINE_EXCEEDED = _cause("deadline_exceeded", _C.DEADLINE)
_TERMINATED_PAST_DEADLINE = _cause("terminated_past_deadline", _C.DEADLINE)


def classify(
    sqlstate: str | None,
    message: str = "",
    *,
    deadline_expired: bool = False,
    cancel_requested: bool = False,
    connection_lost: bool = False,
) -> Cause:
    """The cause of a failed attempt.  The engine's own flags win over the (localised) message."""
    if sqlstate is None:
        return _classify_without_sqlstate(
            message,
            deadline_expired=deadline_expired,
            cancel_requested=cancel_requested,
            connection_lost=connection_lost,
        )
    if sqlstate == "57014":
        return _classify_query_canceled(message, deadline_expired, cancel_requested)
    if sqlstate == "57P01":
        shutdown = _cause("admin_shutdown", _C.CONNECTION)
        return _classify_termination(shutdown, deadline_expired, cancel_requested)
    return _cause(*_lookup(sqlstate))


# A document run's error is one line of text, "[SQLSTATE] …" when PostgreSQL raised it.
_DOCUMENT_SQLSTATE: Final = re.compile(r"\[([0-9A-Z]{5})\]")


def classify_document_error(text: str) -> Cause:
    """The cause of a document run's one-line error text, from its SQLSTATE when it names one."""
    match = _DOCUMENT_SQLSTATE.search(text)
    return classify(match[1] if match else None)


def _lookup(sqlstate: str) -> tuple[str, Category]:
    exact = _BY_SQLSTATE.get(sqlstate)
    if exact is not None:
        return exact
    by_class = _BY_CLASS.get(sqlstate[:2])
    if by_class is not None:
        return by_class
    if _SQLSTATE_SHAPE.fullmatch(sqlstate) and sqlstate[:2] not in _POSTGRES_CLASSES:
        return _USER_DEFINED
    return _INTERNAL


def _classify_query_canceled(message: str, deadline_expired: bool, cancel_requested: bool) -> Cause:
    """57014 is both statement_timeout and pg_cancel_backend: only the flags or the message tell."""
    if deadline_expired or (not cancel_requested and _STATEMENT_TIMEOUT.search(message)):
        return _cause("statement_timeout", _C.DEADLINE)
    if cancel_requested or _USER_REQUEST.search(message):
        return _cause("query_canceled", _C.CANCELLATION)
    return _cause(*_BY_SQLSTATE["57014"])


def _classify_termination(cause: Cause, deadline_expired: bool, cancel_requested: bool) -> Cause:
    """A backend ended under us: our deadline watchdog, our cancellation, or the server going away."""
    if deadline_expired:
        return _TERMINATED_PAST_DEADLINE
    if cancel_requested:
        return _cause(cause.kind, _C.CANCELLATION)
    return cause


def _classify_without_sqlstate(
    message: str, *, deadline_expired: bool, cancel_requested: bool, connection_lost: bool
) -> Cause:
    security_kind = _connect_security_kind(message)
    if security_kind is not None:
        return _cause(security_kind, _C.SECURITY)
    if connection_lost:
        lost = _cause("connection_lost", _C.CONNECTION)
        return _classify_termination(lost, deadline_expired, cancel_requested)
    if deadline_expired:
        return _DEADLINE_EXCEEDED
    if cancel_requested:
        return _cause("cancelled", _C.CANCELLATION)
    return _cause(*_INTERNAL)


def _connect_security_kind(message: str) -> str | None:
    """The security kind a SQLSTATE-less connect failure's message reveals, if any (linear time)."""
    for pattern, kind in _CONNECT_SECURITY_MESSAGES:
        if pattern.search(message):
            return kind
    role = _ROLE_WORD.search(message)
    if role is not None and _DOES_NOT_EXIST in message[role.end() :].lower():
        return "undefined_role"
    return None


# -- retry decision ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetryDecision:
    retry: bool
    delay_ns: int


def backoff_ns(attempt: int) -> int:
    """Delay before attempt ``attempt + 1`` after attempt ``attempt`` (1-based) failed."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt}")
    # the shift is bounded so huge attempt numbers cost nothing
    return min(BACKOFF_BASE_NS << min(attempt - 1, 63), BACKOFF_CAP_NS)


def decide(attempt: int, cause: Cause, max_attempts: int = MAX_ATTEMPTS) -> RetryDecision:
    """Retry a retryable cause while attempts remain (``max_attempts`` per tick, the job's WITH
    (max_attempts = N)); ``delay_ns`` is 0 when not retrying."""
    if cause.retryable and attempt < max_attempts:
        return RetryDecision(True, backoff_ns(attempt))
    return RetryDecision(False, 0)


# -- normalised failure record ------------------------------------------------------------------------

_AUTHENTICATION_REDACTED: Final = "authentication failed (redacted)"
_PERMISSION_REDACTED: Final = "permission denied (redacted)"
_CHECK_HINT: Final = "; `radixjobs check` on the scheduler's node says what to fix (docs/external.md)"
# Security kinds about logging in (every other security kind is a missing privilege), each with a fixed,
# actionable text: what the operator fixes, nothing the server said.
_AUTHENTICATION_KINDS: Final[dict[str, str]] = {
    "invalid_authorization_specification": "the principal may not log in from the scheduler's node",
    "invalid_password": "the principal's password was refused (password file entry, pg_hba.conf line)",
    "authentication_failed": "the principal's login was refused (password file entry, pg_hba.conf line or "
                             "ident map)",
    "no_password": "the scheduler's password file has no entry for the principal",
    "undefined_role": "the principal's role does not exist",
    "login_not_permitted": "the principal's role is NOLOGIN",
    "connect_privilege": "the principal lacks CONNECT on the database",
}
_ELLIPSIS = "…"


def truncate(message: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """``message`` cut to at most ``limit`` characters, an ellipsis marking the cut."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    if len(message) <= limit:
        return message
    return message[: limit - 1] + _ELLIPSIS


def redact(cause: Cause, message: str) -> str:
    """The message fit for history, logs and status: fixed text for security failures, else truncated."""
    if cause.category is Category.SECURITY:
        reason = _AUTHENTICATION_KINDS.get(cause.kind)
        if reason is None:
            return _PERMISSION_REDACTED
        return f"{_AUTHENTICATION_REDACTED}: {reason}{_CHECK_HINT}"
    return truncate(message)


@dataclass(frozen=True)
class AttemptFailure:
    """A failed attempt, normalised.  ``message`` is always redacted/truncated, however it is built."""

    cause: Cause
    sqlstate: str | None
    message: str
    job_id: str
    attempt: int
    planned_at_ns: int
    idempotency_key: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", redact(self.cause, self.message))
        if self.sqlstate is not None and not _SQLSTATE_SHAPE.fullmatch(self.sqlstate):
            object.__setattr__(self, "sqlstate", None)  # not a SQLSTATE: never echo arbitrary text

    def to_json(self) -> dict[str, Any]:
        return {
            "error": ERROR_CODE,
            "kind": self.cause.kind,
            "category": str(self.cause.category),
            "sqlstate": self.sqlstate,
            "message": self.message,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "planned_at_ns": self.planned_at_ns,
            "idempotency_key": self.idempotency_key,
            "detail": {"scheduler_retryable": self.cause.retryable},
        }


def attempt_failure(
    cause: Cause,
    *,
    sqlstate: str | None,
    message: str,
    job_id: str | uuid.UUID,
    attempt: int,
    planned_at_ns: int,
    idempotency_key: str,
) -> AttemptFailure:
    """The normalised PL_JOB_ATTEMPT_FAILED record of one failed attempt."""
    return AttemptFailure(cause, sqlstate, message, str(job_id), attempt, planned_at_ns, idempotency_key)
