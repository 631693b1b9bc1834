"""Property tests of the job DDL parser: it raises nothing but ParseError, and parses what it is given."""

from __future__ import annotations

import re
from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixjobs.ddl import is_job_statement, parse_job_statement
from radixjobs.errors import ParseError
from radixjobs.model import (
    AtSchedule,
    CallArgument,
    Constant,
    CreateJob,
    CronSchedule,
    EverySchedule,
    JobStatement,
    QualifiedName,
    Schedule,
)

VALID = [
    "CREATE JOB maintenance.expire_sessions SCHEDULE EVERY INTERVAL '5 minute' RUN AS maintenance_worker "
    "CALL auth.expire_sessions(batch_size => 1000) ENABLE;",
    "create job if not exists \"A\".b schedule every interval '1h30m' starting at timestamp "
    "'2026-01-01T00:00:00.5+01:00' run as r call s.p(1, -2.5, E'x\\n', $$d$$, NULL, TRUE) disable",
    "CREATE JOB a.b SCHEDULE CRON '*/5 3 * * mon-fri' TIME ZONE 'Europe/Berlin' RUN AS r "
    "CALL s.p(ARRAY[[1], [2]], ARRAY[]::int[], double precision '1.5', CAST('1' AS numeric(10, 2)), "
    "x => '{1}'::int[], y => INTERVAL '1' DAY, z => public.mood 'ok' /* c */) -- t\n",
    "CREATE JOB a.b SCHEDULE AT TIMESTAMP '2026-01-01' RUN AS r CALL s.p('it''s', 5::bigint, -5::int)",
    'ALTER JOB "A".b DISABLE;',
    "DROP JOB IF EXISTS a.b CASCADE;",
]

SQL_ALPHABET = "'\"$()[],;.:-+*/=<>!@#%^&|`?~\\ \n\tEeBbXxUu0123456789aAzZ_é\x00"
TOKENS = [
    *("CREATE", "JOB", "ALTER", "DROP", "RUN", "IF", "NOT", "EXISTS", "SCHEDULE", "EVERY", "AT", "CRON"),
    *("TIME", "ZONE", "INTERVAL", "STARTING", "TIMESTAMP", "AS", "CALL", "ENABLE", "DISABLE", "ARRAY"),
    *("CAST", "NULL", "TRUE", "DEFAULT", "SELECT", "a.b", "s.p", "x", "(", ")", "[", "]", ",", ";", "."),
    *("::", "=>", "-", "+", "*", "1", "1.5", ".5", "1e3", "$1", "$$x$$", "'x'", "'5 minutes'", "'0 3 * * *'"),
    *("'UTC'", "'2026-01-01'", "E'\\x41'", '"Q"', "/*", "*/", "--", "\n"),
]
_TOKEN_SPLIT = re.compile(r"\s+|'(?:[^']|'')*'|\$\$.*?\$\$|\"[^\"]*\"|\w+|::|=>|\S", re.DOTALL)


def parses_or_fails_cleanly(text: str) -> JobStatement | None:
    """Parse ``text``: the only acceptable failure is a ParseError with a sane position."""
    assert isinstance(is_job_statement(text), bool)
    try:
        return parse_job_statement(text)
    except ParseError as exc:
        error = exc
    assert error.position is not None
    assert error.position.line >= 1
    assert error.position.column >= 1
    assert error.message
    return None


FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.text(max_size=200))
def test_random_text_raises_only_parse_error(text: str) -> None:
    parses_or_fails_cleanly(text)


@FAST
@given(st.sampled_from(["", *VALID[0:1], "CREATE JOB a.b SCHEDULE ", "ALTER JOB a.b"]), st.text(SQL_ALPHABET))
def test_sql_like_text_raises_only_parse_error(prefix: str, text: str) -> None:
    parses_or_fails_cleanly(prefix[: len(prefix) // 2] + text)
    parses_or_fails_cleanly(prefix + text)


@FAST
@given(st.lists(st.sampled_from(TOKENS), max_size=40), st.sampled_from([" ", "", "\n"]))
def test_token_soup_raises_only_parse_error(tokens: list[str], separator: str) -> None:
    parses_or_fails_cleanly(separator.join(tokens))


@st.composite
def mutated_statements(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["delete", "insert", "swap", "delete_token", "copy_token", "swap_tokens"]))
        if operation in ("delete", "insert", "swap"):
            at = draw(st.integers(0, max(len(text) - 1, 0)))
            if operation == "delete":
                text = text[:at] + text[at + 1 :]
            elif operation == "insert":
                text = text[:at] + draw(st.sampled_from(SQL_ALPHABET)) + text[at:]
            elif at + 1 < len(text):
                text = text[:at] + text[at + 1] + text[at] + text[at + 2 :]
            continue
        tokens = _TOKEN_SPLIT.findall(text) or [""]
        i, j = draw(st.integers(0, len(tokens) - 1)), draw(st.integers(0, len(tokens) - 1))
        if operation == "delete_token":
            del tokens[i]
        elif operation == "copy_token":
            tokens.insert(i, tokens[j])
        else:
            tokens[i], tokens[j] = tokens[j], tokens[i]
        text = "".join(tokens)
    return text


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_statements())
def test_mutated_statements_raise_only_parse_error(text: str) -> None:
    parses_or_fails_cleanly(text)


def test_valid_seeds_parse() -> None:
    for text in VALID:
        assert parses_or_fails_cleanly(text) is not None, text


# ------------------------------------------------------------------------------------------- round trip

SIMPLE_NAME = re.compile(r"[a-z_][a-z0-9_$]*")
names = st.one_of(
    st.from_regex(r"[a-z_][a-z0-9_$]{0,20}", fullmatch=True),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12),
)
separators = st.sampled_from([" ", "  ", "\n", "\t", " /* c /* n */ */ ", " -- c\n"])
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)


@st.composite
def identifier(draw: st.DrawFn, name: str) -> str:
    if SIMPLE_NAME.fullmatch(name) and draw(st.booleans()):
        return "".join(c.upper() if draw(st.booleans()) else c for c in name) if draw(st.booleans()) else name
    return '"' + name.replace('"', '""') + '"'


@st.composite
def keyword(draw: st.DrawFn, word: str) -> str:
    return draw(st.sampled_from([word.lower(), word.upper(), word.title()]))


@st.composite
def string_literal(draw: st.DrawFn, content: str) -> str:
    style = draw(st.sampled_from(["plain", "escape", "dollar"]))
    if style == "escape":
        return "E'" + content.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if style == "dollar" and (content + "$q$").find("$q$") == len(content):
        return "$q$" + content + "$q$"
    return "'" + content.replace("'", "''") + "'"


TYPES = [  # (as written, normalised, usable as a `type 'literal'` prefix)
    ("INTERVAL", "interval", True),
    ("date", "date", True),
    ("Double  Precision", "double precision", True),
    ("numeric(10, 2)", "numeric(10,2)", True),
    ("timestamp WITH time zone", "timestamp with time zone", True),
    ("character varying(20)", "character varying(20)", True),
    ("public.Mood", "public.mood", True),
    ('"MyType"', '"MyType"', True),
    ("int[]", "int[]", False),
    ("text ARRAY", "text[]", False),
]


@st.composite
def leaf_constants(draw: st.DrawFn) -> tuple[str, Constant]:
    kind = draw(st.sampled_from(["integer", "numeric", "string", "boolean", "null", "typed"]))
    if kind == "integer":
        text = str(draw(st.integers(-(10**20), 10**20)))
        return text, Constant("integer", text)
    if kind == "numeric":
        text = f"{draw(st.integers(-(10**6), 10**6))}.{draw(st.integers(0, 10**6))}"
        return text, Constant("numeric", text)
    if kind == "string":
        content = draw(TEXT)
        return draw(string_literal(content)), Constant("string", content)
    if kind == "boolean":
        value = draw(st.sampled_from(["true", "false"]))
        return draw(keyword(value)), Constant("boolean", value)
    if kind == "null":
        return draw(keyword("null")), Constant("null")
    written, normalised, prefix_ok = draw(st.sampled_from(TYPES))
    content = draw(TEXT)
    literal = draw(string_literal(content))
    forms = [f"{literal}::{written}", f"CAST({literal} AS {written})"] + ([f"{written} {literal}"] if prefix_ok else [])
    return draw(st.sampled_from(forms)), Constant("typed", content, normalised)


def arrays(children: st.SearchStrategy[tuple[str, Constant]]) -> st.SearchStrategy[tuple[str, Constant]]:
    def build(elements: list[tuple[str, Constant]]) -> tuple[str, Constant]:
        if not elements:
            return "ARRAY[]::int[]", Constant("array", type_name="int[]")
        sql = "ARRAY[" + ", ".join(text for text, _ in elements) + "]"
        return sql, Constant("array", elements=tuple(value for _, value in elements))

    return st.lists(children, max_size=3).map(build)


constants = st.recursive(leaf_constants(), arrays, max_leaves=6)

UNITS = {"second": 10**9, "s": 10**9, "min": 60 * 10**9, "minutes": 60 * 10**9, "h": 3_600 * 10**9}
UNITS |= {"hours": 3_600 * 10**9, "day": 86_400 * 10**9, "wk": 604_800 * 10**9}
CRONS = ["* * * * *", "0 3 * * *", "*/10 0 3 * * mon-fri", "@daily", "15 2 1 * *"]
ZONES = ["UTC", "Europe/Berlin", "America/New_York", "Asia/Kolkata"]


def render_timestamp(ns: int) -> str:
    seconds, nanos = divmod(ns, 10**9)
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos:09d}Z"


@st.composite
def schedules(draw: st.DrawFn) -> tuple[list[str], Schedule]:
    kind = draw(st.sampled_from(["every", "at", "cron"]))
    instant = draw(st.integers(0, 2**62))
    if kind == "at":
        return ["AT", "TIMESTAMP", f"'{render_timestamp(instant)}'"], AtSchedule(instant)
    if kind == "cron":
        expression, zone = draw(st.sampled_from(CRONS)), draw(st.sampled_from(ZONES))
        words = ["CRON", f"'{expression}'"] + ([] if zone == "UTC" and draw(st.booleans()) else ["TIME", "ZONE"])
        return words + ([f"'{zone}'"] if words[-1] == "ZONE" else []), CronSchedule(expression, zone)
    parts = draw(st.lists(st.tuples(st.integers(1, 1000), st.sampled_from(sorted(UNITS))), min_size=1, max_size=3))
    interval_text = " ".join(f"{amount}{draw(st.sampled_from(['', ' ']))}{unit}" for amount, unit in parts)
    words = ["EVERY", "INTERVAL", f"'{interval_text}'"]
    starting = draw(st.none() | st.just(instant))
    if starting is not None:
        words += ["STARTING", "AT", "TIMESTAMP", f"'{render_timestamp(starting)}'"]
    return words, EverySchedule(sum(amount * UNITS[unit] for amount, unit in parts), starting)


@st.composite
def create_statements(draw: st.DrawFn) -> tuple[str, CreateJob]:
    job = QualifiedName(draw(names), draw(names))
    procedure = QualifiedName(draw(names), draw(names))
    principal = draw(names)
    schedule_words, schedule = draw(schedules())
    positional = draw(st.lists(constants, max_size=3))
    named_keys = draw(st.lists(names, max_size=3, unique=True))
    named = [(name, draw(constants)) for name in named_keys]
    arguments = [text for text, _ in positional]
    arguments += [f"{draw(identifier(name))} => {text}" for name, (text, _) in named]
    flag = draw(st.sampled_from([None, "ENABLE", "DISABLE"]))
    if_not_exists = draw(st.booleans())
    words = ["CREATE", "JOB"] + (["IF", "NOT", "EXISTS"] if if_not_exists else [])
    words += [f"{draw(identifier(job.schema))}.{draw(identifier(job.name))}", "SCHEDULE", *schedule_words]
    words += ["RUN", "AS", draw(identifier(principal)), "CALL"]
    words += [f"{draw(identifier(procedure.schema))}.{draw(identifier(procedure.name))}"]
    words += ["(" + ", ".join(arguments) + ")"] + ([flag] if flag else []) + draw(st.sampled_from([[], [";"]]))
    rendered = [draw(keyword(word)) if word.isalpha() and word.isupper() else word for word in words]
    text = rendered[0] + "".join(draw(separators) + word for word in rendered[1:])
    expected = CreateJob(
        name=job,
        schedule=schedule,
        principal=principal,
        procedure=procedure,
        arguments=tuple(CallArgument(value) for _, value in positional)
        + tuple(CallArgument(value, name) for name, (_, value) in named),
        enabled=flag != "DISABLE",
        if_not_exists=if_not_exists,
    )
    return text, expected


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(create_statements())
def test_generated_statements_parse_to_what_they_were_built_from(case: tuple[str, CreateJob]) -> None:
    text, expected = case
    assert is_job_statement(text)
    assert parse_job_statement(text) == expected
