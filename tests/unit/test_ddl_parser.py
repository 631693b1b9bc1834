"""Table-driven tests of the job DDL parser: every accepted form, and rejected inputs with positions."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from radixjobs.ddl import TokenKind, is_job_statement, parse_job_statement, tokenize
from radixjobs.errors import ParseError
from radixjobs.model import (
    AlterJob,
    AlterJobGroup,
    AtSchedule,
    CallArgument,
    Constant,
    CreateJob,
    CreateJobGroup,
    CronSchedule,
    DropJob,
    DropJobGroup,
    EverySchedule,
    QualifiedName,
    Schedule,
    SourcePosition,
)

MINUTE = 60 * 10**9
HOUR = 60 * MINUTE
JAN_1_2026 = 1_767_225_600 * 10**9  # 2026-01-01T00:00:00Z

SEED = (
    "CREATE JOB maintenance.expire_sessions SCHEDULE EVERY INTERVAL '5 minute' "
    "RUN AS maintenance_worker CALL auth.expire_sessions(batch_size => 1000) ENABLE;"
)


BASE = CreateJob(
    name=QualifiedName("a", "b"),
    schedule=EverySchedule(HOUR),
    principal="r",
    procedure=QualifiedName("s", "p"),
)


def create(schedule: Schedule | None = None, arguments: tuple[CallArgument, ...] = (), **changes: Any) -> CreateJob:
    """The statement BASE with the given changes (an hourly job a.b run as r calling s.p())."""
    return replace(BASE, schedule=schedule or BASE.schedule, arguments=arguments, **changes)


def test_seed_example_parses_to_the_expected_create_job() -> None:
    assert parse_job_statement(SEED) == CreateJob(
        name=QualifiedName("maintenance", "expire_sessions"),
        schedule=EverySchedule(interval_ns=5 * MINUTE),
        principal="maintenance_worker",
        procedure=QualifiedName("auth", "expire_sessions"),
        arguments=(CallArgument(Constant("integer", "1000"), "batch_size"),),
        enabled=True,
        if_not_exists=False,
    )


STATEMENTS = [
    pytest.param(SEED.lower(), parse_job_statement(SEED), id="lower-case-keywords"),
    pytest.param(
        "create job a.b schedule every interval '1 hour' run as r call s.p()",
        create(),
        id="minimal-no-semicolon",
    ),
    pytest.param(
        "CREATE JOB IF NOT EXISTS a.b SCHEDULE EVERY INTERVAL '1h' RUN AS r CALL s.p() DISABLE;",
        create(enabled=False, if_not_exists=True),
        id="if-not-exists-disable",
    ),
    pytest.param(
        "CREATE JOB a.b SCHEDULE EVERY INTERVAL '1 hour' RUN AS r CALL s.p() ENABLE ;  -- done\n",
        create(),
        id="trailing-comment",
    ),
    pytest.param(
        "CREATE JOB a.b SCHEDULE EVERY INTERVAL '1 hour 30 minutes' "
        "STARTING AT TIMESTAMP '2026-01-01 00:00:00' RUN AS r CALL s.p()",
        create(EverySchedule(90 * MINUTE, JAN_1_2026)),
        id="every-starting-at",
    ),
    pytest.param(
        "CREATE JOB a.b SCHEDULE AT TIMESTAMP '2026-01-01T01:00:00+01:00' RUN AS r CALL s.p()",
        create(AtSchedule(JAN_1_2026)),
        id="at-timestamp-offset",
    ),
    pytest.param(
        "CREATE JOB a.b SCHEDULE CRON '0 3 * * *' RUN AS r CALL s.p()",
        create(CronSchedule("0 3 * * *")),
        id="cron-default-utc",
    ),
    pytest.param(
        "CREATE JOB a.b SCHEDULE CRON '*/10 0 3 * * mon-fri' TIME ZONE 'Europe/Berlin' RUN AS r CALL s.p()",
        create(CronSchedule("*/10 0 3 * * mon-fri", "Europe/Berlin")),
        id="cron-six-fields-time-zone",
    ),
    pytest.param(
        'CREATE JOB "Sales"."Nightly ""Big"" Job" SCHEDULE EVERY INTERVAL \'1 hour\' RUN AS "Worker" CALL "S"."P"()',
        create(
            name=QualifiedName("Sales", 'Nightly "Big" Job'),
            principal="Worker",
            procedure=QualifiedName("S", "P"),
        ),
        id="quoted-identifiers",
    ),
    pytest.param(
        "CREATE JOB Sales.Nightly_$Job SCHEDULE EVERY INTERVAL '1 hour' RUN AS WORKER CALL S.P()",
        create(name=QualifiedName("sales", "nightly_$job"), principal="worker", procedure=QualifiedName("s", "p")),
        id="unquoted-identifiers-fold",
    ),
    pytest.param(
        "/* lead /* nested */ comment */ CREATE\n\tJOB -- x\n a . b SCHEDULE EVERY INTERVAL\n'1 hour'"
        " RUN AS r CALL s . p ( ) /* tail */",
        create(),
        id="comments-and-whitespace-everywhere",
    ),
    pytest.param(
        "CREATE JOB if.x SCHEDULE EVERY INTERVAL '1 hour' RUN AS call CALL s.p()",
        create(name=QualifiedName("if", "x"), principal="call"),
        id="keywords-as-names",
    ),
    pytest.param(
        "CREATE JOB a.b SCHEDULE EVERY INTERVAL $$1 hour$$ RUN AS r CALL s.p()",
        create(),
        id="dollar-quoted-interval",
    ),
    pytest.param("ALTER JOB a.b ENABLE", AlterJob(QualifiedName("a", "b"), True), id="alter-enable"),
    pytest.param("alter job A.B disable;", AlterJob(QualifiedName("a", "b"), False), id="alter-disable"),
    pytest.param("DROP JOB a.b", DropJob(QualifiedName("a", "b")), id="drop"),
    pytest.param("DROP JOB a.b RESTRICT;", DropJob(QualifiedName("a", "b")), id="drop-restrict"),
    pytest.param(
        "drop job if exists a.b cascade",
        DropJob(QualifiedName("a", "b"), True, True),
        id="drop-if-exists-cascade",
    ),
]


@pytest.mark.parametrize(("text", "expected"), STATEMENTS)
def test_accepted_statements(text: str, expected: object) -> None:
    assert parse_job_statement(text) == expected


def typed(value: str | None, type_name: str) -> Constant:
    return Constant("typed", value, type_name)


def array(*elements: Constant, type_name: str | None = None) -> Constant:
    return Constant("array", type_name=type_name, elements=elements)


INT1, INT2 = Constant("integer", "1"), Constant("integer", "2")

ARGUMENTS = [
    ("42", Constant("integer", "42")),
    ("-5", Constant("integer", "-5")),
    ("- 5", Constant("integer", "-5")),
    ("+5", Constant("integer", "5")),
    ("1.5", Constant("numeric", "1.5")),
    ("1e3", Constant("numeric", "1e3")),
    ("1.25E-3", Constant("numeric", "1.25E-3")),
    (".5", Constant("numeric", ".5")),
    ("-.5", Constant("numeric", "-.5")),
    ("1.", Constant("numeric", "1.")),
    ("99999999999999999999999", Constant("integer", "99999999999999999999999")),
    ("'text'", Constant("string", "text")),
    ("'it''s'", Constant("string", "it's")),
    ("''", Constant("string", "")),
    ("'multi\nline'", Constant("string", "multi\nline")),
    ("'con'\n  'tinued'", Constant("string", "continued")),
    ("E'a\\nb\\tc\\\\d\\'e'", Constant("string", "a\nb\tc\\d'e")),
    ("e'\\x41\\101\\u00e9\\U0001F600\\q'", Constant("string", "AAé😀q")),
    ("E'\\xc3\\xa9'", Constant("string", "é")),
    ("E'it''s'", Constant("string", "it's")),
    ("$$dollar 'quoted' $ text$$", Constant("string", "dollar 'quoted' $ text")),
    ("$tag$a $$ b$tag$", Constant("string", "a $$ b")),
    ("$$$$", Constant("string", "")),
    ("TRUE", Constant("boolean", "true")),
    ("false", Constant("boolean", "false")),
    ("NULL", Constant("null")),
    ("INTERVAL '1 day'", typed("1 day", "interval")),
    ("INTERVAL '1' DAY", typed("1", "interval day")),
    ("interval '1:30' hour to minute", typed("1:30", "interval hour to minute")),
    ("DATE '2026-01-01'", typed("2026-01-01", "date")),
    ("TIMESTAMP '2026-01-01 03:00'", typed("2026-01-01 03:00", "timestamp")),
    ("TIMESTAMPTZ '2026-01-01 03:00+01'", typed("2026-01-01 03:00+01", "timestamptz")),
    ("TIME '03:00'", typed("03:00", "time")),
    ("NUMERIC '1.5'", typed("1.5", "numeric")),
    ("numeric(10, 2) '1.5'", typed("1.5", "numeric(10,2)")),
    ("varchar(20) 'x'", typed("x", "varchar(20)")),
    ("double precision '1.5'", typed("1.5", "double precision")),
    ("Timestamp With Time Zone '2026-01-01'", typed("2026-01-01", "timestamp with time zone")),
    ("timestamp(3) without time zone 'x'", typed("x", "timestamp(3) without time zone")),
    ("character varying(20) 'x'", typed("x", "character varying(20)")),
    ("national character varying 'x'", typed("x", "national character varying")),
    ("bit varying(5) '101'", typed("101", "bit varying(5)")),
    ("public.mood 'happy'", typed("happy", "public.mood")),
    ('"Public"."Mood" \'happy\'', typed("happy", '"Public"."Mood"')),
    ("\"mood\" 'happy'", typed("happy", "mood")),
    ("'x'::date", typed("x", "date")),
    ("'2026-01-01' :: DATE", typed("2026-01-01", "date")),
    ("5::bigint", typed("5", "bigint")),
    ("-5::int", typed("-5", "int")),
    ("NULL::int", typed(None, "int")),
    ("true::text", typed("true", "text")),
    ("'{1,2}'::int[]", typed("{1,2}", "int[]")),
    ("'{{1}}'::int[][]", typed("{{1}}", "int[][]")),
    ("'{1}'::int[3]", typed("{1}", "int[]")),
    ("'{1}'::int ARRAY", typed("{1}", "int[]")),
    ("'1'::int::bigint", typed("1", "bigint")),
    ("INTERVAL '1 day'::text", typed("1 day", "text")),
    ("'x'::character varying(20)", typed("x", "character varying(20)")),
    ("'x'::public.mood[]", typed("x", "public.mood[]")),
    ("'1.5'::numeric(10,-1)", typed("1.5", "numeric(10,-1)")),
    ("CAST(1 AS bigint)", typed("1", "bigint")),
    ("CAST('2026-01-01' AS timestamp with time zone)", typed("2026-01-01", "timestamp with time zone")),
    ("cast(NULL as int[])", typed(None, "int[]")),
    ("CAST(CAST(1 AS int) AS bigint)", typed("1", "bigint")),
    ("(5)", INT1.__class__("integer", "5")),
    ("((-1.5))", Constant("numeric", "-1.5")),
    ("ARRAY[1, 2]", array(INT1, INT2)),
    ("array['a', NULL]", array(Constant("string", "a"), Constant("null"))),
    ("ARRAY[[1, 2], [1]]", array(array(INT1, INT2), array(INT1))),
    ("ARRAY[ARRAY[1], ARRAY[2]]", array(array(INT1), array(INT2))),
    ("ARRAY[]::int[]", array(type_name="int[]")),
    ("ARRAY[1, 2]::bigint[]", array(INT1, INT2, type_name="bigint[]")),
    ("ARRAY['1'::int, -2]", array(typed("1", "int"), Constant("integer", "-2"))),
    ("ARRAY[INTERVAL '1 day']", array(typed("1 day", "interval"))),
]


@pytest.mark.parametrize(("argument", "expected"), ARGUMENTS, ids=[a for a, _ in ARGUMENTS])
def test_accepted_argument_constants(argument: str, expected: Constant) -> None:
    statement = parse_job_statement(f"CREATE JOB a.b SCHEDULE EVERY INTERVAL '1 hour' RUN AS r CALL s.p({argument})")
    assert statement == create(arguments=(CallArgument(expected),))


def test_positional_then_named_arguments() -> None:
    statement = parse_job_statement(
        "CREATE JOB a.b SCHEDULE EVERY INTERVAL '1 hour' RUN AS r "
        "CALL s.p(1, 'x', Batch => 2, \"Size\" => NULL, array => ARRAY[1])"
    )
    assert isinstance(statement, CreateJob)
    assert statement.arguments == (
        CallArgument(INT1),
        CallArgument(Constant("string", "x")),
        CallArgument(INT2, "batch"),
        CallArgument(Constant("null"), "Size"),
        CallArgument(array(INT1), "array"),
    )
    assert [a.to_json() for a in statement.arguments][2] == {"name": "batch", "kind": "integer", "value": "2"}


LINE2 = "CREATE JOB a.b SCHEDULE EVERY INTERVAL '1 hour' RUN AS r\nCALL s.p("  # arguments start at 2:10
EVERY = "CREATE JOB a.b SCHEDULE EVERY INTERVAL "  # the interval literal starts at 1:40
RUN_CALL = " RUN AS r CALL s.p()"
CRON = "CREATE JOB a.b SCHEDULE CRON "  # the cron literal starts at 1:30

REJECTED = [
    # statement shape
    ("", "expected CREATE JOB, ALTER JOB, DROP JOB or RUN JOB, found end of input", 1, 1),
    ("  -- only a comment\n", "expected CREATE JOB, ALTER JOB, DROP JOB or RUN JOB, found end of input", 2, 1),
    ("SELECT 1", "expected CREATE JOB, ALTER JOB, DROP JOB or RUN JOB, found 'SELECT'", 1, 1),
    ("CREATE TABLE job (id int)", "expected JOB after CREATE, found 'TABLE'", 1, 8),
    ("CREATE JOBS a.b", "expected JOB after CREATE, found 'JOBS'", 1, 8),
    ("CREATE OR REPLACE JOB IF NOT EXISTS a.b", "CREATE OR REPLACE JOB cannot take IF NOT EXISTS", 1, 23),
    ("run job a.b for", "expected RANGE after FOR, found end of input", 1, 16),
    (
        "CREATE JOB b SCHEDULE EVERY INTERVAL '1 hour'",
        "job name must be schema-qualified (schema.name)",
        1,
        12,
    ),
    ("CREATE JOB db.a.b SCHEDULE", "job name has too many dotted parts", 1, 12),
    ("CREATE JOB a. ;", "expected a name after '.' in the job name, found ';'", 1, 15),
    ('CREATE JOB "".b SCHEDULE', 'zero-length quoted identifier ("")', 1, 12),
    ("CREATE JOB IF EXISTS a.b", "expected NOT EXISTS after IF, found 'EXISTS'", 1, 15),
    ("CREATE JOB a.b RUN AS r CALL s.p()", "expected SCHEDULE, found 'RUN'", 1, 16),
    ("CREATE JOB a.b SCHEDULE DAILY", "expected EVERY, AT, CRON or AFTER after SCHEDULE, found 'DAILY'", 1, 25),
    ("CREATE JOB a.b SCHEDULE EVERY '5 min'", "expected INTERVAL after EVERY, found ''5 min''", 1, 31),
    (EVERY + "5" + RUN_CALL, "expected an interval string, found '5'", 1, 40),
    # interval, timestamp and cron literals: the position is the literal's
    (
        EVERY + "'5 months'" + RUN_CALL,
        "calendar unit 'months' is not allowed in an interval: use days or weeks",
        1,
        40,
    ),
    (EVERY + "'1 year'" + RUN_CALL, "calendar unit 'year' is not allowed", 1, 40),
    (EVERY + "'0 minutes'" + RUN_CALL, "interval must be positive", 1, 40),
    (EVERY + "'-5 minutes'" + RUN_CALL, "interval must be positive", 1, 40),
    (EVERY + "'5'" + RUN_CALL, "missing unit after '5'", 1, 40),
    (EVERY + "'10 fortnights'" + RUN_CALL, "unknown interval unit 'fortnights'", 1, 40),
    (EVERY + "'200 years'" + RUN_CALL, "calendar unit 'years'", 1, 40),
    (EVERY + "'60000 weeks'" + RUN_CALL, "interval too large", 1, 40),
    (EVERY + "'1h' STARTING TIMESTAMP '2026-01-01'", "expected AT after STARTING, found 'TIMESTAMP'", 1, 54),
    (EVERY + "'1h' STARTING AT TIMESTAMP 'tomorrow'" + RUN_CALL, "invalid timestamp 'tomorrow'", 1, 67),
    ("CREATE JOB a.b SCHEDULE AT '2026-01-01'", "expected TIMESTAMP, found ''2026-01-01''", 1, 28),
    ("CREATE JOB a.b SCHEDULE AT TIMESTAMP '2026-02-30 10:00'", "date out of range", 1, 38),
    ("CREATE JOB a.b SCHEDULE AT TIMESTAMP '2026-01-01 25:00'", "time out of range", 1, 38),
    (CRON + "'* * *'" + RUN_CALL, "has 3 fields", 1, 30),
    (CRON + "'61 * * * *'" + RUN_CALL, "invalid cron expression '61 * * * *'", 1, 30),
    (CRON + "'0 0 31 2 *'" + RUN_CALL, "never fires", 1, 30),
    (CRON + "'R * * * *'" + RUN_CALL, "random and hashed fields", 1, 30),
    (CRON + "'0 3 * * *' TIME ZONE 'Mars/Olympus'" + RUN_CALL, "unknown time zone 'Mars/Olympus'", 1, 52),
    (CRON + "'0 3 * * *' TIME 'UTC'", "expected ZONE after TIME, found ''UTC''", 1, 47),
    # RUN AS and CALL
    (EVERY + "'1h' CALL s.p()", "expected RUN AS, found 'CALL'", 1, 45),
    (EVERY + "'1h' RUN r CALL s.p()", "expected AS after RUN, found 'r'", 1, 49),
    (EVERY + "'1h' RUN AS CALL s.p()", "expected a principal (role name) after RUN AS, found 'CALL'", 1, 52),
    (
        EVERY + "'1h' RUN AS a.b CALL s.p()",
        "the principal is a role name and cannot be schema-qualified",
        1,
        52,
    ),
    (EVERY + "'1h' RUN AS r s.p()", "expected CALL, found 's'", 1, 54),
    (EVERY + "'1h' RUN AS r CALL p()", "procedure name must be schema-qualified (schema.procedure)", 1, 59),
    (EVERY + "'1h' RUN AS r CALL s.p", "expected '(' after the procedure name, found end of input", 1, 62),
    # arguments (line 2, column 10 is the first argument)
    (LINE2 + "1", "expected ',' or ')' after an argument, found end of input", 2, 11),
    (LINE2 + "now())", "function calls are not allowed as job arguments: arguments must be constants", 2, 10),
    (LINE2 + "pg_catalog.now())", "function calls are not allowed as job arguments", 2, 10),
    (LINE2 + "1, lower('X'))", "function calls are not allowed as job arguments", 2, 13),
    (LINE2 + "current_timestamp)", "function calls are not allowed as job arguments", 2, 10),
    (LINE2 + "batch_size)", "column references are not allowed as job arguments", 2, 10),
    (LINE2 + "t.col)", "column references are not allowed as job arguments", 2, 10),
    (LINE2 + '"TRUE")', "column references are not allowed as job arguments", 2, 10),
    (LINE2 + "1 + 2)", "operators are not allowed in job arguments", 2, 12),
    (LINE2 + "'a' || 'b')", "operators are not allowed in job arguments", 2, 14),
    (LINE2 + "5-3)", "operators are not allowed in job arguments", 2, 11),
    (LINE2 + "NOT TRUE)", "operators are not allowed in job arguments", 2, 10),
    (LINE2 + "1 IS NULL)", "operators are not allowed in job arguments", 2, 12),
    (LINE2 + "ARRAY[1] [1])", "subscripts are not allowed in job arguments", 2, 19),
    (LINE2 + "(SELECT 1))", "sub-queries are not allowed as job arguments", 2, 11),
    (LINE2 + "ARRAY(SELECT 1))", "sub-queries are not allowed as job arguments", 2, 15),
    (LINE2 + "EXISTS (SELECT 1))", "sub-queries are not allowed as job arguments", 2, 10),
    (LINE2 + "$1)", "parameters ($1) are not allowed as job arguments", 2, 10),
    (LINE2 + "DEFAULT)", "DEFAULT is not allowed as a job argument", 2, 10),
    (LINE2 + "CASE WHEN TRUE THEN 1 END)", "CASE expressions are not allowed", 2, 10),
    (LINE2 + "ROW(1, 2))", "row constructors are not allowed", 2, 10),
    (LINE2 + "(1, 2))", "row constructors are not allowed", 2, 12),
    (LINE2 + "a => 1, 2)", "positional argument cannot follow named argument", 2, 18),
    (LINE2 + "a => 1, A => 2)", "argument name 'a' is used more than once", 2, 18),
    (LINE2 + "-'5')", "unary minus applies only to numeric literals", 2, 10),
    (LINE2 + "- -5)", "unary minus applies only to numeric literals", 2, 10),
    (LINE2 + "ARRAY[])", "cannot determine the type of an empty array", 2, 10),
    (LINE2 + "ARRAY[1 2])", "expected ',' or ']' in ARRAY[...], found '2'", 2, 18),
    (LINE2 + "CAST(1 bigint))", "expected AS in CAST(... AS type), found 'bigint'", 2, 17),
    (LINE2 + "CAST(1 AS bigint", "expected ')' to close CAST(, found end of input", 2, 26),
    (LINE2 + "'x'::)", "expected a type name, found ')'", 2, 15),
    (LINE2 + "'{1}'::int[)", "expected ']' in the array type, found ')'", 2, 21),
    (LINE2 + "'1'::numeric(a))", "expected an integer type modifier, found 'a'", 2, 23),
    (LINE2 + "'x'::timestamp with zone)", "expected TIME after WITH, found 'zone'", 2, 30),
    (LINE2 + "double precision)", "expected a string literal after type name 'double precision'", 2, 26),
    (LINE2 + "'x'::\"\")", 'zero-length quoted identifier ("")', 2, 15),
    (LINE2 + "ARRAY[" * 70 + "1", "argument nested too deeply", 2, 394),
    # lexical errors
    (LINE2 + "'abc)", "unterminated string literal", 2, 10),
    (LINE2 + "'it''s)", "unterminated string literal", 2, 10),
    (LINE2 + "E'abc\\')", "unterminated string literal", 2, 10),
    (LINE2 + "$$abc)", "unterminated dollar-quoted string", 2, 10),
    (LINE2 + "$x$abc$y$)", "unterminated dollar-quoted string", 2, 10),
    ('CREATE JOB "a.b', "unterminated quoted identifier", 1, 12),
    ("CREATE /* a /* nested */ JOB a.b", "unterminated /* comment", 1, 8),
    (LINE2 + "123abc)", "trailing junk after numeric literal", 2, 10),
    (LINE2 + "0x1F)", "trailing junk after numeric literal", 2, 10),
    (LINE2 + "{1})", "unexpected character '{'", 2, 10),
    (LINE2 + "$)", "unexpected character '$'", 2, 10),
    (LINE2 + "E'\\xff')", 'invalid byte sequence for encoding "UTF8"', 2, 11),
    (LINE2 + "E'\\uD800')", "invalid Unicode escape value", 2, 11),
    (LINE2 + "E'a\\0b')", "cannot contain NUL characters", 2, 10),
    (LINE2 + "B'101')", "bit-string literals (B'...') are not supported", 2, 10),
    (LINE2 + "U&'d\\0061t')", "Unicode escape literals (U&'...') are not supported", 2, 10),
    ("CREATE JOB a." + "x" * 64, "is longer than 63 bytes", 1, 14),
    ("CREATE JOB a.b\u00e9", "unexpected character 'é'", 1, 15),
    # end of statement
    (
        EVERY + "'1h' RUN AS r CALL s.p() ENABLE DISABLE",
        "expected ';' or end of statement, found 'DISABLE'",
        1,
        72,
    ),
    (EVERY + "'1h' RUN AS r CALL s.p() NOW", "expected WITH (...), ENABLE, DISABLE, ';' or end of statement", 1, 65),
    (EVERY + "'1h' RUN AS r CALL s.p(); SELECT 1", "after ';': only one statement is allowed", 1, 66),
    (EVERY + "'1h' RUN AS r CALL s.p();;", "unexpected ';' after ';'", 1, 65),
    ("ALTER JOB a.b", "expected ENABLE, DISABLE, SET, RESET or RENAME TO, found end of input", 1, 14),
    ("ALTER JOB a.b RENAME TO c", "new job name must be schema-qualified (schema.name)", 1, 25),
    ("ALTER JOB a.b SET (max_attempts = 0)", "max_attempts must be an integer from 1 to 10", 1, 35),
    ("ALTER JOB a.b ENABLE, DISABLE", "this is changed more than once in the statement", 1, 23),
    ("ALTER JOB b ENABLE", "job name must be schema-qualified", 1, 11),
    ("ALTER TABLE a.b ENABLE", "expected JOB after ALTER, found 'TABLE'", 1, 7),
    ("DROP JOB a.b PURGE", "expected RESTRICT, CASCADE, ';' or end of statement, found 'PURGE'", 1, 14),
    ("DROP JOB IF a.b", "expected EXISTS after IF, found 'a'", 1, 13),
    ("DROP JOB a.b CASCADE RESTRICT", "expected RESTRICT, CASCADE, ';' or end of statement", 1, 22),
    ("\n\n   DROP\n  JOB /* x */ lonely", "job name must be schema-qualified", 4, 15),
]


@pytest.mark.parametrize(("text", "fragment", "line", "column"), REJECTED, ids=[r[1][:50] for r in REJECTED])
def test_rejected_statements(text: str, fragment: str, line: int, column: int) -> None:
    with pytest.raises(ParseError) as caught:
        parse_job_statement(text)
    assert fragment in caught.value.message
    assert caught.value.position == SourcePosition(line, column)


def test_rejected_table_is_large_enough() -> None:
    assert len(REJECTED) >= 45


def test_parse_error_carries_token_and_one_line_message() -> None:
    with pytest.raises(ParseError) as caught:
        parse_job_statement("CREATE JOB a.b RUN AS r CALL s.p()")
    error = caught.value
    assert error.token == "RUN"
    assert error.code == "42601"
    assert str(error) == "syntax error at line 1, column 16 near 'RUN': expected SCHEDULE, found 'RUN'"


def test_schedule_literal_error_points_at_the_literal_on_its_line() -> None:
    with pytest.raises(ParseError) as caught:
        parse_job_statement("CREATE JOB a.b\n  SCHEDULE EVERY INTERVAL\n    '5 months'\n  RUN AS r CALL s.p()")
    assert caught.value.position == SourcePosition(3, 5)
    assert caught.value.token == "'5 months'"


IS_JOB = [
    ("CREATE JOB a.b", True),
    ("create job if not exists a.b", True),
    ("CREATE JOB IF", True),
    ("  /* c /* nested */ */ -- x\n CrEaTe\n\tJoB x", True),
    ("CREATE/**/JOB", True),
    ("CREATE OR REPLACE JOB a.b", True),
    ("create or\nreplace /* x */ job", True),
    ("ALTER JOB a.b ENABLE", True),
    ("DROP JOB a.b", True),
    ("drop job if exists a.b", True),
    ("RUN JOB a.b", True),
    ("", False),
    ("-- CREATE JOB a.b", False),
    ("/* CREATE JOB a.b", False),
    ("CREATE TABLE job (id int)", False),
    ("CREATE JOBS", False),
    ("CREATE JOB_x", False),
    ('CREATE "JOB" a.b', False),
    ("DROP TABLE jobs", False),
    ("ALTER TABLE job ADD COLUMN x int", False),
    ("CREATE OR REPLACE FUNCTION job()", False),
    ("SELECT 'CREATE JOB'", False),
    ("CREATEJOB", False),
    ("RUN", False),
]


@pytest.mark.parametrize(("text", "expected"), IS_JOB)
def test_is_job_statement(text: str, expected: bool) -> None:
    assert is_job_statement(text) is expected


def test_tokenize_positions_and_kinds() -> None:
    tokens = tokenize("a\n  'x' -- c\n\"Q\"::int[]")
    assert [(t.kind, t.value, t.position.line, t.position.column) for t in tokens] == [
        (TokenKind.IDENT, "a", 1, 1),
        (TokenKind.STRING, "x", 2, 3),
        (TokenKind.QUOTED_IDENT, "Q", 3, 1),
        (TokenKind.PUNCT, "::", 3, 4),
        (TokenKind.IDENT, "int", 3, 6),
        (TokenKind.PUNCT, "[", 3, 9),
        (TokenKind.PUNCT, "]", 3, 10),
        (TokenKind.EOF, "", 3, 11),
    ]


def test_operator_tokens_split_like_postgresql() -> None:
    # "=>-5" is "=>" then "-": an operator does not end in + or - (scan.l)
    assert [t.text for t in tokenize("x=>-5")] == ["x", "=>", "-", "5", ""]
    assert [t.text for t in tokenize("a@-b")] == ["a", "@-", "b", ""]


# -- WITH (option = value, ...) and the 1-second minimum -------------------------------------------------

CALL_P = "'1h' RUN AS r CALL s.p() "  # after EVERY: the WITH keyword starts at 1:65


@pytest.mark.parametrize(("suffix", "timeout_ms", "enabled"), [
    ("WITH (timeout = '2 hours')", 7_200_000, True),
    ("with ( TIMEOUT = '1h30m' ) DISABLE", 5_400_000, False),
    ("WITH (timeout = '7 days') ENABLE;", 604_800_000, True),
    ("WITH (timeout = '1.5 seconds')", 1_500, True),
    ("DISABLE", None, False),
])
def test_with_options(suffix: str, timeout_ms: int | None, enabled: bool) -> None:
    stmt = parse_job_statement(EVERY + CALL_P + suffix)
    assert isinstance(stmt, CreateJob)
    assert (stmt.timeout_ms, stmt.enabled) == (timeout_ms, enabled)


@pytest.mark.parametrize(("suffix", "fragment", "column"), [
    ("WITH (retries = 3)", 'unknown option "retries" (accepted: timeout, max_attempts, history, coalesce, batch, '
                           'start_deadline, jitter, group, time_zone, on_failure)', 71),
    ("WITH (jitter = 30)", "jitter must be an interval string", 80),
    ("WITH (jitter = '0 seconds')", "jitter: interval must be positive", 80),
    ("WITH (start_deadline = '-1 minute')", "start_deadline: interval must be positive", 88),
    ("WITH (start_deadline = '2 months')", "calendar unit 'months' is not allowed", 88),
    ("WITH (start_deadline = '10 microseconds')", "must be at least 1 millisecond", 88),
    ("WITH (timeout = '1 hour', nice = 5)", 'unknown option "nice"', 91),
    ("WITH (batch = maybe)", "batch must be on or off", 79),
    ("WITH (timeout = '1h', timeout = '2h')", 'option "timeout" is given more than once', 87),
    ("WITH (timeout = '8 days')", "above the maximum of 7 days", 81),
    ("WITH (timeout = '1 month')", "month", 81),
    ("WITH (timeout = 60)", "timeout must be an interval string", 81),
    ("WITH (timeout '1h')", "expected '=' after option timeout", 79),
    ("WITH timeout = '1h'", "expected '(' after WITH", 70),
    ("WITH (timeout = '1h'", "expected ',' or ')' after an option", 85),
    ("DISABLE WITH (timeout = '1h')", "expected ';' or end of statement, found 'WITH'", 73),
])
def test_rejected_with_options(suffix: str, fragment: str, column: int) -> None:
    with pytest.raises(ParseError) as caught:
        parse_job_statement(EVERY + CALL_P + suffix)
    assert fragment in caught.value.message
    assert caught.value.position == SourcePosition(1, column)


@pytest.mark.parametrize("interval", ["1 millisecond", "999 ms", "0.5 seconds", "500000 microseconds"])
def test_intervals_under_a_second_are_refused(interval: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_job_statement(f"{EVERY}'{interval}' RUN AS r CALL s.p()")
    assert "shorter than the minimum of 1 second" in caught.value.message
    assert caught.value.position == SourcePosition(1, 40)


@pytest.mark.parametrize(("suffix", "options"), [
    ("WITH (start_deadline = '10 minutes')", (("start_deadline", "600000000 microseconds"),)),
    ("WITH (jitter = '30s', start_deadline = '1h')",
     (("jitter", "30000000 microseconds"), ("start_deadline", "3600000000 microseconds"))),
    ("WITH (jitter = '1.5 milliseconds')", (("jitter", "1500 microseconds"),)),
])
def test_interval_options_are_sent_as_microseconds(suffix: str, options: tuple[tuple[str, str], ...]) -> None:
    stmt = parse_job_statement(EVERY + CALL_P + suffix)
    assert isinstance(stmt, CreateJob)
    assert stmt.options == options


@pytest.mark.parametrize(("text", "expected"), [
    ("CREATE JOB GROUP etl WITH (max_running = 2);", CreateJobGroup("etl", 2)),
    ("create job group if not exists \"ETL\" with (max_running = '10000')", CreateJobGroup("ETL", 10000, True)),
    ("ALTER JOB GROUP etl SET (max_running = 3)", AlterJobGroup("etl", 3)),
    ("ALTER JOB GROUP etl RESET (max_running)", AlterJobGroup("etl", None)),
    ("DROP JOB GROUP etl", DropJobGroup("etl")),
    ("DROP JOB GROUP IF EXISTS etl;", DropJobGroup("etl", True)),
])
def test_job_group_statements(text: str, expected: object) -> None:
    assert parse_job_statement(text) == expected


def test_a_job_in_a_schema_called_group_is_a_job_and_the_group_option() -> None:
    stmt = parse_job_statement(EVERY + CALL_P.replace("s.p()", "group.p()") + "WITH (group = etl)")
    assert isinstance(stmt, CreateJob)
    assert stmt.options == (("group", "etl"),)
    assert parse_job_statement("DROP JOB group.x") == DropJob(QualifiedName("group", "x"))
    altered = parse_job_statement("ALTER JOB a.b SET (group = 'Etl'), RESET (timeout)")
    assert isinstance(altered, AlterJob)
    assert altered.options == (("group", "Etl"),)
    assert parse_job_statement("ALTER JOB a.b RESET (group)") == AlterJob(QualifiedName("a", "b"), reset=("group",))


@pytest.mark.parametrize(("text", "fragment"), [
    ("CREATE JOB GROUP etl WITH (max_running = 0)", "max_running must be an integer from 1 to 10000"),
    ("CREATE JOB GROUP etl WITH (max_running = -1)", "max_running must be an integer from 1 to 10000"),
    ("CREATE JOB GROUP etl WITH (max_running = 10001)", "max_running must be an integer from 1 to 10000"),
    ("CREATE JOB GROUP etl", "expected WITH (max_running = N)"),
    ("CREATE JOB GROUP etl WITH (timeout = 2)", "expected max_running"),
    ("CREATE JOB GROUP s.etl WITH (max_running = 1)", "cannot be schema-qualified"),
    ("CREATE JOB GROUP etl WITH (max_running = 1, max_running = 2)", "expected ')'"),
    ("ALTER JOB GROUP etl RESET (timeout)", "expected max_running"),
    ("ALTER JOB GROUP etl", "expected SET (max_running = N) or RESET (max_running)"),
    ("DROP JOB GROUP etl CASCADE", "expected ';' or end of statement"),
    (EVERY + CALL_P + "WITH (group = 5)", "group must be a job group's name"),
])
def test_rejected_job_group_statements(text: str, fragment: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_job_statement(text)
    assert fragment in caught.value.message


def test_the_on_failure_option_names_a_procedure() -> None:
    stmt = parse_job_statement(EVERY + CALL_P + "WITH (on_failure = 'app.alert', max_attempts = 2)")
    assert isinstance(stmt, CreateJob)
    assert ("on_failure", "app.alert") in stmt.options
    altered = parse_job_statement("ALTER JOB a.b SET (on_failure = '\"App\".\"Alert\"')")
    assert isinstance(altered, AlterJob)
    assert altered.options == (("on_failure", '"App"."Alert"'),)
    assert parse_job_statement("ALTER JOB a.b RESET (on_failure)") == AlterJob(QualifiedName("a", "b"),
                                                                              reset=("on_failure",))


@pytest.mark.parametrize("value", ["app.alert", "5", "'alert'", "''"])
def test_on_failure_must_be_a_qualified_name_string(value: str) -> None:
    with pytest.raises(ParseError) as caught:
        parse_job_statement(EVERY + CALL_P + f"WITH (on_failure = {value})")
    assert "on_failure must be a procedure's qualified name string" in caught.value.message
