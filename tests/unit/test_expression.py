"""The schedule expression checker (pglast): what it accepts, what it refuses, what it rewrites."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest
from pglast import parse_sql

from radixjobs.documents.expression import MAX_DEPTH, MAX_LENGTH, ExpressionRefused, check

NOW = "CAST($1 AS timestamp with time zone)"


@pytest.mark.parametrize("text", [
    "NOW() + INTERVAL '5 minutes'",
    "NOW() + INTERVAL '1 hour'",
    "DATE_TRUNC('day', NOW()) + INTERVAL '1 day' + INTERVAL '3 hours'",
    "NOW() + INTERVAL '1 day'",
])
def test_seed_examples_are_accepted(text: str) -> None:
    checked = check(text)
    assert checked.text == text
    assert checked.sql.startswith("SELECT CAST(")
    assert checked.sql.endswith("AS timestamp with time zone)")
    assert NOW in checked.sql
    assert "now()" not in checked.sql.lower()


@pytest.mark.parametrize("text", [
    "date_trunc('hour', now()) + make_interval(hours => 1)",
    "greatest(now() + interval '1 minute', '2025-06-01'::timestamptz)",
    "coalesce(NULL, now() + interval '1 day')",
    "CASE WHEN extract(dow FROM now()) = 5 THEN now() + interval '3 days' ELSE now() + interval '1 day' END",
    "date_bin('15 minutes', now(), '2000-01-01') + interval '15 minutes'",
    "(now() AT TIME ZONE 'Europe/Moscow')::date + time '03:00'",
    "to_timestamp(floor(extract(epoch FROM now()) / 60) * 60 + 60)",
    "justify_hours(interval '36 hours') + now()",
    "current_timestamp + interval '1 hour'",
    "CURRENT_DATE + 1",
    "localtimestamp(0) + interval '1 hour'",
    "pg_catalog.now() + interval '1 hour'",
    "now() + interval '1' hour",
    "nullif(now(), now()) IS NULL",
    # what the seed's users write (issue #12): IN, IS DISTINCT FROM, LIKE, CASE on timestamps, to_char, age
    "CASE WHEN to_char(now(), 'Dy') IN ('Sat', 'Sun') THEN now() + interval '2 days' "
    "ELSE now() + interval '1 hour' END",
    "CASE WHEN extract(dow FROM now()) NOT IN (0, 6) THEN now() + interval '1 hour' END",
    "CASE WHEN now()::date IS DISTINCT FROM CURRENT_DATE THEN now() END",
    "CASE WHEN to_char(now(), 'Day') LIKE 'Mon%' THEN now() + interval '1 hour' END",
    "CASE WHEN to_char(now(), 'Month') ILIKE 'jan%' THEN now() + interval '1 day' END",
    "CASE WHEN now() < date_trunc('day', now()) + interval '9 hours' THEN date_trunc('day', now()) + interval "
    "'9 hours' ELSE date_trunc('day', now()) + interval '33 hours' END",
    "CASE WHEN now() BETWEEN SYMMETRIC timestamptz '2025-02-01' AND timestamptz '2025-01-01' THEN now() END",
    "now() + age(timestamp '2025-01-01', timestamp '2024-12-31')",
    "(to_char(now(), 'YYYY-MM-DD') || ' 09:00')::timestamptz + interval '1 day'",
])
def test_useful_expressions_are_accepted(text: str) -> None:
    assert "$1" in check(text).sql


@pytest.mark.parametrize("text", ["app.next_slot(now())", "public.now()", '"My App".next_time()'])
def test_the_principals_own_qualified_functions_are_accepted(text: str) -> None:
    """Run as RUN_AS, read-only, under the timeout: the principal's own code, as DB_FUNCTION runs it."""
    sql = check(text).sql
    assert "." in sql.split("CAST(", 1)[1]  # kept qualified: resolved in its schema only


def test_one_argument_age_counts_from_the_parameter() -> None:
    sql = check("now() + age(timestamp '2020-01-01')").sql
    assert sql.count("$1") == 2
    assert "age(CAST(CAST(CAST($1" in sql


@pytest.mark.parametrize("text", [
    "now()", "transaction_timestamp()", "statement_timestamp()", "clock_timestamp()", "CURRENT_TIMESTAMP",
])
def test_every_current_time_function_becomes_the_parameter(text: str) -> None:
    assert check(text).sql == f"SELECT CAST({NOW} AS timestamp with time zone)"


def test_current_date_and_precision_keep_their_type() -> None:
    assert check("CURRENT_DATE").sql == f"SELECT CAST(CAST({NOW} AS pg_catalog.date) AS timestamp with time zone)"
    assert "timestamp(0) with time zone" in check("CURRENT_TIMESTAMP(0)").sql


def test_comments_are_gone_from_what_runs() -> None:
    checked = check("now() /* ) */ + interval '1 day' -- trailing")
    assert checked.sql == f"SELECT CAST({NOW} + CAST('1 day' AS interval) AS timestamp with time zone)"


def test_what_runs_is_one_statement() -> None:
    assert len(parse_sql(check("now() + interval '1 hour'").sql)) == 1


@pytest.mark.parametrize(("text", "reason"), [
    ("NEXT_DAY(NOW(), 'MONDAY') + INTERVAL '9 hours'", "function next_day() is not allowed"),
    ("now(); DROP TABLE app.victim", "only one expression is allowed (no statement separators)"),
    ("now()); DROP TABLE app.victim; SELECT (now()", "syntax error"),
    ("now()) FROM app.secrets WHERE s::int > 0 --", "syntax error"),
    ("now() FROM app.secrets", "only an expression is allowed (found FROM)"),
    ("now() WHERE true", "only an expression is allowed (found WHERE)"),
    ("now() UNION SELECT now()", "UNION/INTERSECT/EXCEPT"),
    ("now(), now()", "exactly one expression is allowed"),
    ("now() FOR UPDATE", "found FOR UPDATE"),
    ("(SELECT now())", "a sub-query is not allowed"),
    ("now() + (SELECT max(s) FROM secrets)::interval", "table secrets must be qualified by its schema"),
    ("EXISTS (SELECT 1)", "a sub-query is not allowed"),
    ("now() + pg_sleep(10)::text::interval", "function pg_sleep() is not allowed"),
    ("nextval('app.seq')::text::timestamptz", "function nextval() is not allowed"),
    ("set_config('statement_timeout', '0', false)::timestamptz", "function set_config() is not allowed"),
    ("a.b.c()", "qualified function names are not allowed: a.b.c"),
    ("pg_temp.f()", "temporary functions cannot be called"),
    ("information_schema._pg_truetypid(1, 2)", "qualified function names are not allowed"),
    ("pg_catalog.pg_sleep(1)", "function pg_sleep() is not allowed"),
    ("pg_sleep(1)", "write it schema-qualified"),
    ("(SELECT now())", "put the query in a function of your own"),
    ("now() IN (SELECT now())", "a sub-query is not allowed"),
    ("now() = ANY (ARRAY[now()])", "= ANY (...) is not allowed: use IN (a, b, …)"),
    ("'a' SIMILAR TO 'b'", "SIMILAR TO is not allowed"),
    ("now() ~ 'x'", "operator ~ is not allowed"),
    ("now()::app.mytype", "qualified type names are not allowed"),
    ("'app.secrets'::regclass::text::timestamptz", "type regclass is not allowed"),
    ("now() OPERATOR(public.+) interval '1 day'", "qualified operator names are not allowed"),
    ("now() OPERATOR(pg_catalog.~) 'x'", "operator ~ is not allowed"),
    ("s", "a column or name reference (s) is not allowed: an expression has no columns"),
    ("app.secrets.s", "a column or name reference"),
    ("$1", "a parameter is not allowed"),
    ("current_user::text::timestamptz", "CURRENT_USER is not allowed"),
    ("ARRAY[now()]", "an array is not allowed"),
    ("count(*)", "function count() is not allowed"),
    ("max(now())", "function max() is not allowed"),
    ("now() COLLATE \"C\"", "COLLATE is not allowed"),
    ("", "the expression is empty"),
    ("   ", "the expression is empty"),
    ("now() + " * 2000, "longer than"),
])
def test_refused(text: str, reason: str) -> None:
    with pytest.raises(ExpressionRefused) as refused:
        check(text)
    assert reason in str(refused.value)


def test_syntax_error_position_counts_from_the_expression() -> None:
    with pytest.raises(ExpressionRefused, match=r'syntax error at or near "\)" at character 6'):
        check("now()) FROM secrets --")


def test_deep_nesting_is_refused() -> None:
    text = "now()" + " + (interval '1 second'" * (MAX_DEPTH + 5) + ")" * (MAX_DEPTH + 5)
    with pytest.raises(ExpressionRefused, match="nested too deeply"):
        check(text)


@pytest.mark.parametrize("text", ["lpad('', 500000000)::timestamptz", "repeat('x', 1000000000)::timestamptz",
                                  "replace(replace('aa', 'a', 'aa'), 'a', 'aa')::timestamptz"])
def test_text_functions_that_inflate_a_value_are_refused(text: str) -> None:
    with pytest.raises(ExpressionRefused, match="is not allowed"):
        check(text)


# -- random() and sub-queries over the principal's tables ----------------------------------------------------

@pytest.mark.parametrize("text", [
    "now() + random() * interval '10 minutes'",
    "now() + interval '1 hour' + (random() * 300)::int * interval '1 second'",
    "now() + (SELECT max(s) FROM app.secrets)::interval",
    "(SELECT min(s.at) FROM app.slots s WHERE s.at > now())",
    "coalesce((SELECT min(at) FROM app.slots WHERE at > now() AND kind = 'backup'), now() + interval '1 day')",
    "CASE WHEN EXISTS (SELECT 1 FROM app.holidays h WHERE h.day = CURRENT_DATE) THEN now() + interval '1 day' "
    "ELSE now() + interval '1 hour' END",
    "(SELECT s.at FROM app.slots AS s WHERE s.at > now() ORDER BY s.at LIMIT 1)",
    "(SELECT max(a.at) FROM app.slots a JOIN app.kinds k ON k.name = a.kind LEFT JOIN app.x x USING (id))",
    "now() + (SELECT count(*) FILTER (WHERE ok) FROM app.runs GROUP BY day HAVING count(*) > 1 LIMIT 1) "
    "* interval '1 minute'",
    "(SELECT app.next_slot(max(at)) FROM app.slots)",
    "(SELECT max(at) FROM app.slots WHERE at < (SELECT max(at) FROM app.slots))",
    '(SELECT max("At") FROM "My App"."Slots")',
])
def test_random_and_sub_queries_over_tables_are_accepted(text: str) -> None:
    sql = check(text).sql
    assert sql.startswith("SELECT CAST(")
    assert sql.endswith("AS timestamp with time zone)")
    assert "now()" not in sql.lower()  # "now" is the parameter inside sub-queries too


@pytest.mark.parametrize(("text", "reason"), [
    ("setseed(0.5)::text::timestamptz", "function setseed() is not allowed"),
    ("(SELECT max(at) FROM app.t WHERE pg_sleep(5) IS NULL)", "function pg_sleep() is not allowed"),
    ("(SELECT max(at) FROM app.t WHERE set_config('statement_timeout', '0', true) = '0')",
     "function set_config() is not allowed"),
    ("(SELECT nextval('app.seq') FROM app.t)::text::timestamptz", "function nextval() is not allowed"),
    ("(SELECT max(at) FROM app.t WHERE dblink_exec('x') = 'y')", "function dblink_exec() is not allowed"),
    ("(SELECT max(at) FROM app.t WHERE EXISTS (SELECT 1 FROM app.u WHERE dblink('x', 'y') IS NULL))",
     "function dblink() is not allowed"),
    ("(SELECT max(at) FROM app.t FOR UPDATE)", "FOR UPDATE/SHARE is not allowed in a sub-query"),
    ("(SELECT max(at) FROM app.t FOR SHARE)", "FOR UPDATE/SHARE is not allowed in a sub-query"),
    ("(WITH d AS (DELETE FROM app.t RETURNING at) SELECT max(at) FROM d)", "WITH is not allowed in a sub-query"),
    ("(WITH d AS (SELECT at FROM app.t) SELECT max(at) FROM d)", "WITH is not allowed in a sub-query"),
    ("(SELECT max(at) FROM app.t UNION SELECT now())", "UNION/INTERSECT/EXCEPT is not allowed in a sub-query"),
    ("(SELECT max(at) INTO app.copy FROM app.t)", "INTO is not allowed in a sub-query"),
    ("(SELECT DISTINCT at FROM app.t)", "DISTINCT is not allowed in a sub-query"),
    ("(SELECT max(at) FROM pg_sleep(5), app.t)", "a function in FROM is not allowed"),
    ("(SELECT max(at) FROM generate_series(1, 10) g)", "a function in FROM is not allowed"),
    ("(SELECT max(at) FROM (SELECT at FROM app.t) s)", "a sub-query in FROM is not allowed"),
    ("(SELECT max(at) FROM app.t TABLESAMPLE SYSTEM (10))", "TABLESAMPLE in FROM is not allowed"),
    ("(SELECT max(at) FROM slots)", "table slots must be qualified by its schema (myschema.slots)"),
    ("(SELECT max(at) FROM pg_temp.slots)", "temporary tables cannot be read"),
    ("(SELECT max(rolname)::timestamptz FROM pg_catalog.pg_authid)", "table pg_catalog.pg_authid is not allowed"),
    ("(SELECT max(x)::timestamptz FROM information_schema.tables)", "is not allowed: read tables of your own"),
    ("(SELECT max(at) FROM otherdb.app.t)", "a database name cannot be given"),
    ("(SELECT at, at FROM app.t)", "a sub-query must select exactly one value"),
    ("(SELECT max(at) OVER () FROM app.t)", "aggregate or window syntax is not allowed in max()"),
    ("(SELECT string_agg(x, ',')::timestamptz FROM app.t)", "function string_agg() is not allowed"),
    ("(SELECT max(at) FROM app.t ORDER BY 1 USING <)", "ORDER BY … USING is not allowed"),
    ("now() IN (SELECT at FROM app.t)", "a sub-query is not allowed with IN, ANY, ALL or ARRAY"),
    ("now() = ANY (SELECT at FROM app.t)", "a sub-query is not allowed with IN, ANY, ALL or ARRAY"),
    ("ARRAY(SELECT at FROM app.t)", "a sub-query is not allowed with IN, ANY, ALL or ARRAY"),
    ("(SELECT max(at::regclass::text)::timestamptz FROM app.t)", "type regclass is not allowed"),
    ("(SELECT max(at) FROM app.t WHERE $1 IS NULL)", "a parameter is not allowed"),
    ("max(at)", "function max() is not allowed outside a sub-query"),
    ("at + interval '1 day'", "a column or name reference (at) is not allowed: an expression has no columns"),
])
def test_sub_queries_are_held_to_the_same_rules(text: str, reason: str) -> None:
    with pytest.raises(ExpressionRefused) as refused:
        check(text)
    assert reason in str(refused.value)


# -- limits: a run of one operator is one level; nesting is bounded; the printer stays within recursion ---------

TERM = " + interval '1 minute'"


def test_a_flat_sum_up_to_the_length_limit_is_accepted() -> None:
    eighty = "now()" + TERM * 80
    assert check(eighty).sql.count("$1") == 1
    longest = "now()" + TERM * ((MAX_LENGTH - len("now()")) // len(TERM))
    assert len(longest) > MAX_LENGTH - len(TERM)
    check(longest)
    with pytest.raises(ExpressionRefused, match=f"longer than {MAX_LENGTH} characters"):
        check(longest + TERM)
    ones = "now() + interval '1 second' * (1" + " + 1" * ((MAX_LENGTH - 40) // 4) + ")"
    assert len(ones) <= MAX_LENGTH
    check(ones)  # ~490 terms
    check("now() + interval '1 s' * (" + " - ".join(["1 * 2 + 3"] * 120) + ")")  # a run of mixed operators
    check("CASE WHEN " + " AND ".join(["true"] * 200) + " THEN now() END")  # AND lists are flat


@pytest.mark.parametrize(("form", "deepest"), [
    (lambda k: "now() + interval '1 s' * " + "abs(" * k + "1" + ")" * k, MAX_DEPTH - 2),
    (lambda k: "now()" + "::timestamptz" * k, MAX_DEPTH),
    (lambda k: "now() + (interval '1 s'" + " + (interval '1 s'" * k + ")" * k + ")", MAX_DEPTH - 2),
    (lambda k: "(SELECT max(t.at) FROM app.t WHERE t.at > " * k + "now()" + ")" * k, MAX_DEPTH // 3),
])
def test_the_nesting_limit_is_exact(form: Any, deepest: int) -> None:
    check(form(deepest))
    with pytest.raises(ExpressionRefused, match=f"nested too deeply \\(more than {MAX_DEPTH} levels\\)"):
        check(form(deepest + 1))


def test_the_deepest_expressions_leave_half_the_recursion_limit_to_the_caller() -> None:
    """check() at the nesting limit needs well under Python's default limit of 1000 frames: run it under 600."""
    deepest = ["now() + (interval '1 s'" + " + (interval '1 s'" * (MAX_DEPTH - 2) + ")" * (MAX_DEPTH - 2) + ")",
               "coalesce(" * MAX_DEPTH + "now()" + ")" * MAX_DEPTH,
               "(SELECT max(t.at) FROM app.t WHERE t.at > " * (MAX_DEPTH // 3) + "now()" + ")" * (MAX_DEPTH // 3),
               "now()" + TERM * 90]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(len(inspect.stack()) + 600)
    try:
        for text in deepest:
            check(text)
    finally:
        sys.setrecursionlimit(limit)
