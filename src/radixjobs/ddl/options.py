"""Job options, ``WITH (name = value, …)`` at CREATE and ``SET (…)`` / ``RESET (…)`` at ALTER, PostgreSQL's
storage-parameter style. Each value is checked here, at its token, and again by the database
(radix._normalise_options), which stores it."""

from __future__ import annotations

from collections.abc import Callable

from radixjobs import schedule as sched
from radixjobs.ddl.tokens import Token, TokenKind
from radixjobs.errors import ParseError, ScheduleError

MAX_TIMEOUT_MS = 7 * 86_400_000  # radix.max_timeout_ms()
OPTION_DEFAULTS = {"timeout": "4 minutes", "max_attempts": "5", "history": "256", "coalesce": "on", "batch": "off",
                   "start_deadline": "none", "jitter": "none", "group": "none", "time_zone": "UTC (CRON only)",
                   "on_failure": "none"}
MAX_GROUP_RUNNING = 10_000  # radix.job_groups.max_running
JOB_OPTIONS = tuple(OPTION_DEFAULTS)
_SWITCH = {"on": "on", "true": "on", "yes": "on", "1": "on", "off": "off", "false": "off", "no": "off", "0": "off"}


def check_option(name: Token, value: Token, fail: Callable[[str, Token], ParseError]) -> str | int:
    """The value of option ``name`` as the database takes it (a timeout in milliseconds), or raise
    ``fail(message, token)`` naming the problem at the value's token."""
    text = value.value
    if name.value == "timeout":
        if value.kind is not TokenKind.STRING:
            raise fail("timeout must be an interval string, e.g. timeout = '2 hours'", value)
        try:
            ns = sched.parse_interval(text)
        except ScheduleError as exc:
            raise fail(str(exc), value) from None
        if ns < 1_000_000:
            raise fail(f"timeout '{text}' must be at least 1 millisecond", value)
        if ns > MAX_TIMEOUT_MS * 1_000_000:
            raise fail(f"timeout '{text}' is above the maximum of 7 days", value)
        return ns // 1_000_000
    if name.value in ("start_deadline", "jitter"):
        return _positive_interval(name.value, value, fail)
    if name.value in ("max_attempts", "history"):
        top = 10 if name.value == "max_attempts" else 100_000
        if value.kind not in (TokenKind.NUMBER, TokenKind.STRING) or not text.isdigit() or not 1 <= int(text) <= top:
            raise fail(f"{name.value} must be an integer from 1 to {top}", value)
        return int(text)
    if name.value == "group":
        if value.kind not in (TokenKind.STRING, TokenKind.IDENT, TokenKind.QUOTED_IDENT) or not text:
            raise fail("group must be a job group's name, e.g. group = 'etl'", value)
        return text
    if name.value == "on_failure":
        if value.kind is not TokenKind.STRING or text.count(".") < 1 or not text.strip():
            raise fail("on_failure must be a procedure's qualified name string, e.g. on_failure = 'app.alert'", value)
        return text
    if name.value in ("coalesce", "batch"):
        if text.lower() not in _SWITCH:
            raise fail(f"{name.value} must be on or off", value)
        return _SWITCH[text.lower()]
    # time_zone
    if value.kind is not TokenKind.STRING:
        raise fail("time_zone must be a string, e.g. time_zone = 'Europe/Berlin'", value)
    try:
        sched.load_time_zone(text)
    except ScheduleError as exc:
        raise fail(str(exc), value) from None
    return text


def check_max_running(value: Token, fail: Callable[[str, Token], ParseError]) -> int:
    """A job group's max_running: an integer from 1 to MAX_GROUP_RUNNING."""
    text = value.value
    if value.kind not in (TokenKind.NUMBER, TokenKind.STRING) or not text.isdigit() \
            or not 1 <= int(text) <= MAX_GROUP_RUNNING:
        raise fail(f"max_running must be an integer from 1 to {MAX_GROUP_RUNNING}", value)
    return int(text)


def _positive_interval(name: str, value: Token, fail: Callable[[str, Token], ParseError]) -> str:
    """An interval option (start_deadline, jitter) of at least a millisecond, as the database reads it: a whole
    number of microseconds."""
    if value.kind is not TokenKind.STRING:
        raise fail(f"{name} must be an interval string, e.g. {name} = '10 minutes'", value)
    try:
        ns = sched.parse_interval(value.value)
    except ScheduleError as exc:
        raise fail(f"{name}: {exc}", value) from None
    if ns < 1_000_000:
        raise fail(f"{name} '{value.value}' must be at least 1 millisecond", value)
    return f"{ns // 1000} microseconds"
