"""retry: SQLSTATE classification, backoff, retry decision and the redacted failure record."""

from __future__ import annotations

import dataclasses
import json
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixjobs.retry import (
    BACKOFF_CAP_NS,
    MAX_ATTEMPTS,
    MAX_MESSAGE_CHARS,
    AttemptFailure,
    Category,
    Cause,
    RetryDecision,
    attempt_failure,
    backoff_ns,
    classify,
    decide,
    redact,
    truncate,
)

MS = 1_000_000
C = Category

# (sqlstate, kind, category, retryable) with no flags and no message.
BY_SQLSTATE: list[tuple[str, str, Category, bool]] = [
    ("40001", "serialization_failure", C.CONFLICT, True),
    ("40P01", "deadlock_detected", C.CONFLICT, True),
    ("55P03", "lock_not_available", C.CONFLICT, True),
    ("57014", "query_canceled", C.CANCELLATION, True),
    ("25P04", "transaction_timeout", C.DEADLINE, True),
    ("25P03", "idle_in_transaction_session_timeout", C.DEADLINE, True),
    ("57P05", "idle_session_timeout", C.DEADLINE, True),
    ("57P01", "admin_shutdown", C.CONNECTION, True),
    ("57P02", "crash_shutdown", C.CONNECTION, True),
    ("57P03", "cannot_connect_now", C.CONNECTION, True),
    ("53300", "too_many_connections", C.CONNECTION, True),
    ("08000", "connection_exception", C.CONNECTION, True),
    ("08003", "connection_does_not_exist", C.CONNECTION, True),
    ("08006", "connection_failure", C.CONNECTION, True),
    ("08001", "sqlclient_unable_to_establish_sqlconnection", C.CONNECTION, True),
    ("08007", "transaction_resolution_unknown", C.CONNECTION, True),
    ("08P01", "protocol_violation", C.CONNECTION, True),
    ("08999", "connection_exception", C.CONNECTION, True),
    ("42501", "insufficient_privilege", C.SECURITY, False),
    ("28000", "invalid_authorization_specification", C.SECURITY, False),
    ("28P01", "invalid_password", C.SECURITY, False),
    ("28999", "invalid_authorization_specification", C.SECURITY, False),
    ("0LP01", "invalid_grant_operation", C.SECURITY, False),
    ("42883", "undefined_function", C.UNDEFINED_OBJECT, False),
    ("42725", "ambiguous_function", C.UNDEFINED_OBJECT, False),
    ("42704", "undefined_object", C.UNDEFINED_OBJECT, False),
    ("42P01", "undefined_table", C.UNDEFINED_OBJECT, False),
    ("42703", "undefined_column", C.UNDEFINED_OBJECT, False),
    ("3F000", "invalid_schema_name", C.UNDEFINED_OBJECT, False),
    ("22000", "data_exception", C.DATA, False),
    ("22001", "string_data_right_truncation", C.DATA, False),
    ("22003", "numeric_value_out_of_range", C.DATA, False),
    ("22007", "invalid_datetime_format", C.DATA, False),
    ("22008", "datetime_field_overflow", C.DATA, False),
    ("22012", "division_by_zero", C.DATA, False),
    ("22023", "invalid_parameter_value", C.DATA, False),
    ("22P02", "invalid_text_representation", C.DATA, False),
    ("2202E", "array_subscript_error", C.DATA, False),
    ("22ZZZ", "data_exception", C.DATA, False),
    ("23000", "integrity_constraint_violation", C.DATA, False),
    ("23502", "not_null_violation", C.DATA, False),
    ("23503", "foreign_key_violation", C.DATA, False),
    ("23505", "unique_violation", C.DATA, False),
    ("23514", "check_violation", C.DATA, False),
    ("23P01", "exclusion_violation", C.DATA, False),
    ("23999", "integrity_constraint_violation", C.DATA, False),
    ("P0001", "raise_exception", C.RAISED_EXCEPTION, False),
    ("P0002", "no_data_found", C.RAISED_EXCEPTION, False),
    ("P0004", "assert_failure", C.RAISED_EXCEPTION, False),
    ("RX001", "user_defined_exception", C.RAISED_EXCEPTION, False),
    ("AB123", "user_defined_exception", C.RAISED_EXCEPTION, False),
    ("2D000", "invalid_transaction_termination", C.INTERNAL, False),
    ("XX000", "internal_error", C.INTERNAL, False),
    ("XX001", "data_corrupted", C.INTERNAL, False),
    ("42601", "internal_error", C.INTERNAL, False),  # syntax_error: a known class, unlisted code
    ("53100", "internal_error", C.INTERNAL, False),  # disk_full
    ("40000", "internal_error", C.INTERNAL, False),
    ("", "internal_error", C.INTERNAL, False),
    ("bogus", "internal_error", C.INTERNAL, False),  # not a SQLSTATE: lower case
    ("RX0011", "internal_error", C.INTERNAL, False),  # not a SQLSTATE: six characters
]


@pytest.mark.parametrize(
    ("sqlstate", "kind", "category", "retryable"), BY_SQLSTATE, ids=[r[0] or "empty" for r in BY_SQLSTATE]
)
def test_classify_by_sqlstate(sqlstate: str, kind: str, category: Category, retryable: bool) -> None:
    assert classify(sqlstate) == Cause(kind, category, retryable)


# (sqlstate, message, flags, kind, category)
WITH_CONTEXT: list[tuple[str | None, str, dict[str, bool], str, Category]] = [
    ("57014", "canceling statement due to statement timeout", {}, "statement_timeout", C.DEADLINE),
    ("57014", "CANCELING STATEMENT DUE TO STATEMENT TIMEOUT", {}, "statement_timeout", C.DEADLINE),
    ("57014", "canceling statement due to user request", {}, "query_canceled", C.CANCELLATION),
    ("57014", "Abbruch der Anfrage", {"deadline_expired": True}, "statement_timeout", C.DEADLINE),
    ("57014", "Abbruch der Anfrage", {"cancel_requested": True}, "query_canceled", C.CANCELLATION),
    # the engine's bookkeeping wins over the message
    ("57014", "due to user request", {"deadline_expired": True}, "statement_timeout", C.DEADLINE),
    ("57014", "due to statement timeout", {"cancel_requested": True}, "query_canceled", C.CANCELLATION),
    (
        "57014",
        "",
        {"deadline_expired": True, "cancel_requested": True},
        "statement_timeout",
        C.DEADLINE,
    ),
    ("57P01", "terminating connection", {"deadline_expired": True}, "terminated_past_deadline", C.DEADLINE),
    ("57P01", "terminating connection", {"cancel_requested": True}, "admin_shutdown", C.CANCELLATION),
    ("57P01", "terminating connection", {"connection_lost": True}, "admin_shutdown", C.CONNECTION),
    (None, "server closed the connection", {"connection_lost": True}, "connection_lost", C.CONNECTION),
    (
        None,
        "server closed the connection",
        {"connection_lost": True, "deadline_expired": True},
        "terminated_past_deadline",
        C.DEADLINE,
    ),
    (
        None,
        "server closed the connection",
        {"connection_lost": True, "cancel_requested": True},
        "connection_lost",
        C.CANCELLATION,
    ),
    (None, "", {"deadline_expired": True}, "deadline_exceeded", C.DEADLINE),
    (None, "", {"cancel_requested": True}, "cancelled", C.CANCELLATION),
    (None, "something odd", {}, "internal_error", C.INTERNAL),
    (
        None,
        'connection failed: FATAL:  password authentication failed for user "alice"',
        {"connection_lost": True},
        "authentication_failed",
        C.SECURITY,
    ),
    (None, 'FATAL:  Peer authentication failed for user "bob"', {}, "authentication_failed", C.SECURITY),
    (None, 'FATAL:  no pg_hba.conf entry for host "[local]"', {}, "authentication_failed", C.SECURITY),
    (None, 'FATAL:  role "ghost" does not exist', {"connection_lost": True}, "undefined_role", C.SECURITY),
    (None, 'FATAL:  Role "ghost"\ndoes not exist', {}, "undefined_role", C.SECURITY),
    (None, 'FATAL:  role "nologin" is not permitted to log in', {}, "login_not_permitted", C.SECURITY),
    # libpq's own, when the password file has no entry for the role: terminal, not a lost connection
    (None, 'connection to server at "127.0.0.1", port 5432 failed: fe_sendauth: no password supplied',
     {"connection_lost": True}, "no_password", C.SECURITY),
    (None, 'database "x" does not exist', {"connection_lost": True}, "connection_lost", C.CONNECTION),
    (None, "does not exist: role", {}, "internal_error", C.INTERNAL),
    # a SQLSTATE decides on its own: the message is not consulted
    ("40001", "password authentication failed", {}, "serialization_failure", C.CONFLICT),
    ("42501", "permission denied", {"deadline_expired": True}, "insufficient_privilege", C.SECURITY),
]


@pytest.mark.parametrize(("sqlstate", "message", "flags", "kind", "category"), WITH_CONTEXT)
def test_classify_with_context(
    sqlstate: str | None, message: str, flags: dict[str, bool], kind: str, category: Category
) -> None:
    cause = classify(sqlstate, message, **flags)
    assert (cause.kind, cause.category) == (kind, category)
    assert cause.retryable == (category in {C.CONFLICT, C.DEADLINE, C.CANCELLATION, C.CONNECTION})


def test_category_members_are_exactly_the_spec_list() -> None:
    assert [str(c) for c in Category] == [
        "conflict",
        "deadline",
        "cancellation",
        "connection",
        "security",
        "undefined_object",
        "data",
        "raised_exception",
        "internal",
    ]


def test_cause_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        classify("40001").retryable = False  # type: ignore[misc]


@settings(max_examples=300)
@given(
    st.one_of(st.none(), st.text(max_size=8), st.from_regex(r"[0-9A-Z]{5}", fullmatch=True)),
    st.text(max_size=200),
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
def test_classify_is_total(
    sqlstate: str | None, message: str, deadline: bool, cancel: bool, lost: bool
) -> None:
    flags = {"deadline_expired": deadline, "cancel_requested": cancel, "connection_lost": lost}
    cause = classify(sqlstate, message, **flags)
    assert isinstance(cause.category, Category)
    assert cause.kind.isidentifier()
    assert cause.retryable == (cause.category in {C.CONFLICT, C.DEADLINE, C.CANCELLATION, C.CONNECTION})


def test_classify_long_message_is_fast() -> None:
    classify(None, "role " * 200_000)  # linear scan, no backtracking blow-up


# -- backoff and decision ---------------------------------------------------------------------------


def test_backoff_sequence() -> None:
    assert [backoff_ns(a) // MS for a in range(1, 11)] == [
        100, 200, 400, 800, 1600, 3200, 6400, 10_000, 10_000, 10_000,
    ]


@pytest.mark.parametrize("attempt", [8, 64, 65, 1000, 10**9])
def test_backoff_is_capped(attempt: int) -> None:
    assert backoff_ns(attempt) == BACKOFF_CAP_NS == 10_000 * MS


@pytest.mark.parametrize("attempt", [0, -1])
def test_backoff_rejects_attempt_below_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="attempt"):
        backoff_ns(attempt)


RETRYABLE = classify("40001")
TERMINAL = classify("P0001")


@pytest.mark.parametrize(
    ("attempt", "cause", "expected"),
    [
        (1, RETRYABLE, RetryDecision(True, 100 * MS)),
        (2, RETRYABLE, RetryDecision(True, 200 * MS)),
        (3, RETRYABLE, RetryDecision(True, 400 * MS)),
        (4, RETRYABLE, RetryDecision(True, 800 * MS)),
        (5, RETRYABLE, RetryDecision(False, 0)),
        (6, RETRYABLE, RetryDecision(False, 0)),
        *[(a, TERMINAL, RetryDecision(False, 0)) for a in range(1, 7)],
    ],
)
def test_decide(attempt: int, cause: Cause, expected: RetryDecision) -> None:
    assert decide(attempt, cause) == expected


def test_max_attempts() -> None:
    assert MAX_ATTEMPTS == 5


# -- failure record and redaction ----------------------------------------------------------------

JOB_ID = "8f1c1a8e-0000-4000-8000-000000000001"
KEY = f"{JOB_ID}/1767225600000000000"


def failure(cause: Cause, message: str, sqlstate: str | None = "P0001") -> AttemptFailure:
    return attempt_failure(
        cause,
        sqlstate=sqlstate,
        message=message,
        job_id=JOB_ID,
        attempt=2,
        planned_at_ns=1_767_225_600_000_000_000,
        idempotency_key=KEY,
    )


def test_failure_json_shape() -> None:
    cause = classify("40P01")
    assert failure(cause, "deadlock detected", "40P01").to_json() == {
        "error": "PL_JOB_ATTEMPT_FAILED",
        "kind": "deadlock_detected",
        "category": "conflict",
        "sqlstate": "40P01",
        "message": "deadlock detected",
        "job_id": JOB_ID,
        "attempt": 2,
        "planned_at_ns": 1_767_225_600_000_000_000,
        "idempotency_key": KEY,
        "detail": {"scheduler_retryable": True},
    }


def test_failure_json_is_serialisable_and_terminal_flag() -> None:
    document = failure(classify("23505"), "duplicate key", "23505").to_json()
    assert json.loads(json.dumps(document)) == document
    assert document["detail"] == {"scheduler_retryable": False}
    assert document["category"] == "data"


def test_uuid_job_id_is_rendered_as_text() -> None:
    record = attempt_failure(
        TERMINAL,
        sqlstate="P0001",
        message="x",
        job_id=uuid.UUID(JOB_ID),
        attempt=1,
        planned_at_ns=0,
        idempotency_key=KEY,
    )
    assert record.to_json()["job_id"] == JOB_ID


def test_not_a_sqlstate_is_never_echoed() -> None:
    assert failure(TERMINAL, "x", sqlstate="role alice").to_json()["sqlstate"] is None
    assert failure(TERMINAL, "x", sqlstate=None).to_json()["sqlstate"] is None


@pytest.mark.parametrize(
    ("sqlstate", "message", "expected"),
    [
        ("42501", "permission denied for table payroll", "permission denied (redacted)"),
        ("42501", "permission denied for schema hr", "permission denied (redacted)"),
        ("0LP01", 'grant options cannot be granted back to grantor "alice"', "permission denied (redacted)"),
        ("28P01", 'password authentication failed for user "alice"', "authentication failed (redacted)"),
        ("28000", 'role "alice" is not permitted to log in', "authentication failed (redacted)"),
        (None, 'role "ghost" does not exist', "authentication failed (redacted)"),
        (None, 'password authentication failed for user "alice"', "authentication failed (redacted)"),
    ],
)
def test_security_messages_are_redacted(sqlstate: str | None, message: str, expected: str) -> None:
    cause = classify(sqlstate, message)
    assert cause.category is C.SECURITY
    assert redact(cause, message).startswith(expected)
    assert "alice" not in redact(cause, message)
    assert "ghost" not in redact(cause, message)
    record = failure(cause, message, sqlstate)
    assert record.message == redact(cause, message)
    assert record.to_json()["sqlstate"] == sqlstate


def test_redaction_holds_for_direct_construction_and_replace() -> None:
    cause = classify("42501")
    record = AttemptFailure(cause, "42501", "permission denied for table payroll", JOB_ID, 1, 0, KEY)
    assert record.message == "permission denied (redacted)"
    replaced = dataclasses.replace(record, message="permission denied for table payroll")
    assert replaced.message == "permission denied (redacted)"


def test_non_security_message_kept_and_truncated() -> None:
    assert failure(TERMINAL, "boom").message == "boom"
    long = "x" * (MAX_MESSAGE_CHARS + 500)
    cut = failure(TERMINAL, long).message
    assert len(cut) == MAX_MESSAGE_CHARS
    assert cut.endswith("…")
    assert cut[:-1] == long[: MAX_MESSAGE_CHARS - 1]


@pytest.mark.parametrize(
    ("message", "limit", "expected"),
    [("", 5, ""), ("abcde", 5, "abcde"), ("abcdef", 5, "abcd…"), ("ab", 1, "…"), ("a", 1, "a")],
)
def test_truncate(message: str, limit: int, expected: str) -> None:
    assert truncate(message, limit) == expected


def test_truncate_rejects_non_positive_limit() -> None:
    with pytest.raises(ValueError, match="limit"):
        truncate("x", 0)


SECURITY_INPUTS: list[tuple[str | None, dict[str, bool]]] = [
    ("42501", {}),
    ("28000", {}),
    ("28P01", {"connection_lost": True}),
    ("0L000", {}),
    ("0P000", {"deadline_expired": True}),
]
_MARKER = st.from_regex(r"zq[a-z0-9]{8}", fullmatch=True)


@settings(max_examples=300)
@given(
    st.sampled_from(SECURITY_INPUTS),
    _MARKER,
    st.text(max_size=100),
    st.text(max_size=100),
    st.sampled_from(['role "{m}" does not exist', "authentication failed for {m}", "{m}", 'table "{m}"']),
)
def test_redacted_security_failure_never_leaks(
    source: tuple[str | None, dict[str, bool]], marker: str, before: str, after: str, template: str
) -> None:
    message = before + template.format(m=marker) + after
    sqlstate, flags = source
    cause = classify(sqlstate, message, **flags)
    assert cause.category is C.SECURITY
    document = json.dumps(failure(cause, message, sqlstate).to_json(), ensure_ascii=False)
    assert marker not in document
    assert marker not in redact(cause, message)


@settings(max_examples=300)
@given(
    _MARKER,
    st.text(max_size=100),
    st.sampled_from(
        [
            'FATAL:  password authentication failed for user "{m}"',
            'FATAL:  role "{m}" does not exist',
            'FATAL:  role "{m}" is not permitted to log in',
            'FATAL:  no pg_hba.conf entry for host "[local]", user "{m}"',
            'connection to server at "{m}" failed: fe_sendauth: no password supplied',
        ]
    ),
    st.booleans(),
)
def test_redacted_connect_failure_never_leaks(marker: str, prefix: str, template: str, lost: bool) -> None:
    message = prefix + template.format(m=marker)
    cause = classify(None, message, connection_lost=lost)
    assert cause.category is C.SECURITY
    assert not cause.retryable
    document = json.dumps(failure(cause, message, None).to_json(), ensure_ascii=False)
    assert marker not in document
