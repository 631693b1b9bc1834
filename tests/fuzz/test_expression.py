"""INTERVAL / INTERVAL_ERROR expressions: the checker refuses with a one-line reason, or accepts, and what it
accepts is verified again by an independent walk over the statement that would run.

The walk is the oracle: whatever text got in, the deparsed statement must be ``SELECT CAST(<expr> AS
timestamptz)`` built only from allow-listed node types, functions, types and operators, with "now" as the
one parameter ``$1`` — never a FROM at the top, a second statement or an unlisted function; a column or an
aggregate only inside a scalar or EXISTS sub-query, which reads schema-qualified tables of the database's own
schemas, with no WITH, set operation, locking clause, INTO or DISTINCT.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from pglast import ast, parse_sql
from pglast.enums.parsenodes import A_Expr_Kind
from pglast.enums.primnodes import SubLinkType
from pglast.visitors import Visitor

from radixjobs.documents.expression import (
    AGGREGATES,
    ALLOWED_FUNCTIONS,
    ALLOWED_OPERATORS,
    ALLOWED_TYPES,
    NOW_FUNCTIONS,
    ExpressionRefused,
    check,
)
from tests.fuzz import fuzz_settings

ACCEPTED = [
    "NOW() + INTERVAL '5 minutes'", "DATE_TRUNC('day', NOW()) + INTERVAL '1 day' + INTERVAL '3 hours'",
    "date_trunc('week', now()) + interval '1 week 9 hours'",
    "(date_trunc('day', now() AT TIME ZONE 'Europe/Moscow') + interval '1 day 3 hours') AT TIME ZONE 'Europe/Moscow'",
    "greatest(now() + interval '1 minute', '2025-06-01'::timestamptz)", "coalesce(NULL, now() + interval '1 day')",
    "CASE WHEN extract(dow FROM now()) = 5 THEN now() + interval '3 days' ELSE now() + interval '1 day' END",
    "date_bin('15 minutes', now(), '2000-01-01') + interval '15 minutes'", "CURRENT_DATE + 1",
    "to_timestamp(floor(extract(epoch FROM now()) / 60) * 60 + 60)", "localtimestamp(0) + interval '1 hour'",
    "make_interval(hours => 1) + now()", "now() + interval '1' hour", "nullif(now(), now()) IS NULL",
    "CASE WHEN to_char(now(), 'Dy') IN ('Sat', 'Sun') THEN now() + interval '2 days' END",
    "CASE WHEN to_char(now(), 'Day') LIKE 'Mon%' THEN now() END", "app.next_slot(now())",
    "CASE WHEN now()::date IS DISTINCT FROM CURRENT_DATE THEN now() + age(timestamp '2025-01-01') END",
    "now() + random() * interval '1 minute'", "(SELECT min(s.at) FROM app.slots s WHERE s.at > now())",
    "CASE WHEN EXISTS (SELECT 1 FROM app.h WHERE day = CURRENT_DATE) THEN now() + interval '1 day' END",
    "coalesce((SELECT max(at) FROM app.t a JOIN app.u b ON a.id = b.id GROUP BY a.k LIMIT 1), now())",
    "now()" + " + interval '1 minute'" * 80,
]
ATTACKS = [
    "; DROP TABLE t", ") FROM pg_authid --", " UNION SELECT now()", "::regclass", " || 'x'", "(SELECT 1)",
    " FROM pg_sleep(10)", "), pg_sleep(10", " /* */ ", "--", "$1", " COLLATE \"C\"", "pg_sleep(1)",
    "set_config('a', 'b', false)", "public.now()", "'x'::app.t", "ARRAY[1]", "current_user", "E'\\''",
    "$$;$$", "now() OPERATOR(public.+) 1", "lo_import('/etc/passwd')", "query_to_xml('select 1', true, true, '')",
    " WHERE true", "\x00", "\\", "'", "\"", "(", ")", "[", "]", " FOR UPDATE", "(SELECT max(at) FROM app.t)",
    "(SELECT at FROM pg_catalog.pg_authid)", " FROM app.t", " FROM t", "WITH d AS (DELETE FROM app.t RETURNING 1)",
    "EXISTS (SELECT 1 FROM app.t", "setseed(0.5)", "random()", "count(*)", " JOIN pg_temp.t ON true", "at",
]
TOKENS = ["now()", "NOW()", "current_timestamp", "CURRENT_DATE", "localtime(2)", "interval", "INTERVAL '1 day'",
          "'1 hour'", "'2025-01-01'", "::", "timestamptz", "date", "text", "int", "+", "-", "*", "/", "%", "<",
          "=", "(", ")", ",", "AND", "OR", "NOT", "IS", "NULL", "CASE", "WHEN", "THEN", "ELSE", "END",
          "BETWEEN", "AT TIME ZONE", "'UTC'", "date_trunc", "extract", "epoch FROM", "greatest", "coalesce",
          "make_interval", "hours =>", "1", "1.5", "true", "IN", "LIKE", "ILIKE", "DISTINCT FROM", "to_char",
          "age", "app.f", "pg_temp.f", "'Mon%'", "ANY", "SIMILAR TO", *ATTACKS]
ALLOWED_NODES = {"SelectStmt", "ResTarget", "TypeCast", "TypeName", "String", "Integer", "Float", "Boolean",
                 "A_Const", "ParamRef", "FuncCall", "NamedArgExpr", "A_Expr", "BoolExpr", "NullTest",
                 "BooleanTest", "CaseExpr", "CaseWhen", "CoalesceExpr", "MinMaxExpr", "BitString",
                 # in a sub-query only (checked below)
                 "SubLink", "RangeVar", "JoinExpr", "Alias", "ColumnRef", "A_Star", "SortBy"}
IN_QUERY_ONLY = {"RangeVar", "JoinExpr", "Alias", "ColumnRef", "A_Star", "SortBy"}
SYSTEM_SCHEMAS = ("pg_catalog", "pg_toast", "information_schema")
QUERY_REFUSED = ("withClause", "larg", "rarg", "lockingClause", "intoClause", "distinctClause", "windowClause",
                 "valuesLists")
ALLOWED_KINDS = {A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_IN, A_Expr_Kind.AEXPR_DISTINCT,
                 A_Expr_Kind.AEXPR_NOT_DISTINCT, A_Expr_Kind.AEXPR_LIKE, A_Expr_Kind.AEXPR_ILIKE,
                 A_Expr_Kind.AEXPR_NULLIF, A_Expr_Kind.AEXPR_BETWEEN, A_Expr_Kind.AEXPR_NOT_BETWEEN,
                 A_Expr_Kind.AEXPR_BETWEEN_SYM, A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM}
SELECT_CLAUSES = ("distinctClause", "intoClause", "fromClause", "whereClause", "groupClause", "havingClause",
                  "windowClause", "valuesLists", "sortClause", "limitOffset", "limitCount", "lockingClause",
                  "withClause", "larg", "rarg")


def _last(names: Any) -> str:
    parts = [n.sval for n in names]
    assert len(parts) == 1 or (len(parts) == 2 and parts[0] == "pg_catalog"), parts
    return str(parts[-1])


def _in_query(ancestors: Any) -> bool:
    while ancestors is not None:
        if isinstance(ancestors.node, ast.SubLink):
            return True
        ancestors = ancestors.parent
    return False


class _Oracle(Visitor):
    """Fails on anything outside the allow-list in a parse tree."""

    def visit(self, ancestors: Any, node: Any) -> None:
        kind = type(node).__name__
        assert kind in ALLOWED_NODES, kind
        assert kind not in IN_QUERY_ONLY or _in_query(ancestors), kind
        if isinstance(node, ast.SubLink):
            assert node.subLinkType in (SubLinkType.EXPR_SUBLINK, SubLinkType.EXISTS_SUBLINK), node.subLinkType
            query = node.subselect
            assert isinstance(query, ast.SelectStmt)
            assert query.fromClause
            for clause in QUERY_REFUSED:
                assert not getattr(query, clause, None), clause
        elif isinstance(node, ast.RangeVar):
            assert node.schemaname, node
            assert not node.catalogname, node
            assert not node.schemaname.startswith("pg_"), node
            assert node.schemaname != "information_schema", node
        elif isinstance(node, ast.SortBy):
            assert not node.useOp
        elif isinstance(node, ast.FuncCall):
            parts = [n.sval for n in node.funcname]
            if len(parts) == 2 and parts[0] not in SYSTEM_SCHEMAS:  # the principal's own, by its schema
                assert not parts[0].startswith("pg_temp"), parts
                return
            name = _last(node.funcname)
            assert name in ALLOWED_FUNCTIONS or (name in AGGREGATES and _in_query(ancestors)), name
            assert not node.over, name
            assert not (name in NOW_FUNCTIONS and not node.args), "now() must have become $1"
        elif isinstance(node, ast.TypeName):
            assert _last(node.names) in ALLOWED_TYPES | {"timestamptz", "interval"}, node.names
        elif isinstance(node, ast.ParamRef):
            assert node.number == 1
        elif isinstance(node, ast.A_Expr):
            assert node.kind in ALLOWED_KINDS, node.kind
            if node.name and node.kind in (A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_LIKE, A_Expr_Kind.AEXPR_ILIKE):
                assert _last(node.name) in ALLOWED_OPERATORS, node.name


def accepted_or_refused_cleanly(text: str) -> None:
    try:
        checked = check(text)
    except ExpressionRefused as exc:
        message = str(exc)
        assert message
        assert "\n" not in message, repr(message)
        return
    statements = parse_sql(checked.sql)
    assert len(statements) == 1
    stmt = statements[0].stmt
    assert isinstance(stmt, ast.SelectStmt)
    for clause in SELECT_CLAUSES:
        assert not getattr(stmt, clause, None), clause
    assert stmt.targetList is not None
    (target,) = stmt.targetList
    assert isinstance(target.val, ast.TypeCast)
    assert target.val.typeName is not None
    assert _last(target.val.typeName.names) == "timestamptz"
    _Oracle()(stmt)


@fuzz_settings()
@given(st.text(max_size=300))
def test_random_text(text: str) -> None:
    accepted_or_refused_cleanly(text)


@fuzz_settings()
@given(st.lists(st.sampled_from(TOKENS), min_size=1, max_size=25), st.sampled_from([" ", ""]))
def test_token_soup(tokens: list[str], separator: str) -> None:
    accepted_or_refused_cleanly(separator.join(tokens))


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(ACCEPTED))
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(text)))
        operation = draw(st.sampled_from(["insert", "delete", "attack", "truncate", "wrap"]))
        if operation == "insert":
            text = text[:at] + draw(st.sampled_from(TOKENS)) + text[at:]
        elif operation == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)):]
        elif operation == "attack":
            text = text[:at] + draw(st.sampled_from(ATTACKS)) + text[at:]
        elif operation == "truncate":
            text = text[:at]
        else:
            text = f"{draw(st.sampled_from(['(', 'coalesce(', 'greatest(now(), ', 'NOT ']))}{text})"
    return text


@fuzz_settings()
@given(mutated())
def test_mutated_expressions(text: str) -> None:
    accepted_or_refused_cleanly(text)


def test_the_seeds_are_accepted() -> None:
    for text in ACCEPTED:
        check(text)
        accepted_or_refused_cleanly(text)
