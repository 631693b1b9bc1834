"""Schedule expressions (INTERVAL, INTERVAL_ERROR): checked with PostgreSQL's own parser, evaluated safely.

An expression is user text that PostgreSQL evaluates, so it is never pasted into SQL as given
(research: postgres-facts §8 — a closing parenthesis alone can inject clauses). ``check`` parses
``SELECT <expression>`` with pglast and accepts exactly one plain SELECT with one target and nothing
else, built only from allow-listed node types, operators (IN, IS DISTINCT FROM, LIKE, BETWEEN included),
types and functions, without qualified names (except the ``pg_catalog.`` the grammar itself writes) — but
a function qualified by a schema of the database's own (``myschema.next_time(now())``) is accepted: it is
the principal's own code, resolved in that schema only, run as the principal under the same guarantees
(as DB_FUNCTION runs any code of its own). Never a sub-query, a column, a temporary function or a system
schema's function outside the allow-list. The tree is then rebuilt as
``SELECT CAST(<expression> AS timestamptz)`` and deparsed: comments and anything unparsed are gone.

The current time functions (``now()``, ``CURRENT_TIMESTAMP``, ``CURRENT_DATE``, ``LOCALTIMESTAMP``,
``clock_timestamp()``…) are replaced by the bound parameter ``$1``: "now" is the scheduler's clock at the
end of the run, passed in, so the next time does not depend on when the evaluating transaction began,
and tests can drive time. ``evaluate`` runs the checked statement with that parameter (extended
protocol: one statement only) in a READ ONLY transaction that is rolled back, with a short
statement_timeout, search_path = pg_catalog and TimeZone = UTC, on a connection logged in as the
document's principal; the pool's reset (everything DISCARD ALL does but DISCARD PLANS) cleans the session after.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Final

import psycopg
from pglast import ast, parse_sql
from pglast.enums.parsenodes import A_Expr_Kind
from pglast.enums.primnodes import BoolExprType, SQLValueFunctionOp
from pglast.parser import ParseError
from pglast.stream import RawStream

from radixjobs import retry
from radixjobs.db import first_line

MAX_LENGTH: Final = 2000
MAX_DEPTH: Final = 64

ALLOWED_FUNCTIONS: Final = frozenset({
    "now", "transaction_timestamp", "statement_timestamp", "clock_timestamp",
    "date_trunc", "date_part", "extract", "date_bin", "date_add", "date_subtract", "timezone", "isfinite",
    "make_interval", "make_date", "make_time", "make_timestamp", "make_timestamptz",
    "to_timestamp", "to_date", "justify_days", "justify_hours", "justify_interval",
    "abs", "ceil", "ceiling", "floor", "round", "trunc", "mod",
    "age", "to_char", "to_number", "lower", "upper", "length", "char_length", "substr", "substring",
    "btrim", "ltrim", "rtrim", "concat", "left", "right", "strpos", "position",
})
# zero-argument functions whose value is "now": replaced by the parameter
NOW_FUNCTIONS: Final = frozenset({"now", "transaction_timestamp", "statement_timestamp", "clock_timestamp"})
ALLOWED_TYPES: Final = frozenset({
    "timestamp", "timestamptz", "date", "interval", "time", "timetz", "text", "varchar", "bpchar",
    "int2", "int4", "int8", "integer", "smallint", "bigint", "numeric", "float4", "float8", "bool",
})
ALLOWED_OPERATORS: Final = frozenset({"+", "-", "*", "/", "%", "<", ">", "<=", ">=", "=", "<>", "||",
                                      "~~", "!~~", "~~*", "!~~*"})
# expression kinds besides plain operators: IN (...) of values, IS [NOT] DISTINCT FROM, [NOT] [I]LIKE,
# NULLIF, [NOT] BETWEEN [SYMMETRIC]
_ALLOWED_KINDS: Final = frozenset({
    A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_IN, A_Expr_Kind.AEXPR_DISTINCT, A_Expr_Kind.AEXPR_NOT_DISTINCT,
    A_Expr_Kind.AEXPR_LIKE, A_Expr_Kind.AEXPR_ILIKE, A_Expr_Kind.AEXPR_NULLIF, A_Expr_Kind.AEXPR_BETWEEN,
    A_Expr_Kind.AEXPR_NOT_BETWEEN, A_Expr_Kind.AEXPR_BETWEEN_SYM, A_Expr_Kind.AEXPR_NOT_BETWEEN_SYM,
})
# schemas whose functions are never called by a qualified name (pg_catalog's are allow-listed by name)
_SYSTEM_SCHEMAS: Final = ("pg_catalog", "pg_toast", "information_schema")
OWN_FUNCTION_HINT: Final = ("for a function of your own, write it schema-qualified (myschema.next_time(...)): "
                            "it runs as RUN_AS, read-only and under the timeout")
_NOW_TYPES: Final = {
    SQLValueFunctionOp.SVFOP_CURRENT_DATE: "date",
    SQLValueFunctionOp.SVFOP_CURRENT_TIME: "timetz",
    SQLValueFunctionOp.SVFOP_CURRENT_TIME_N: "timetz",
    SQLValueFunctionOp.SVFOP_CURRENT_TIMESTAMP: "timestamptz",
    SQLValueFunctionOp.SVFOP_CURRENT_TIMESTAMP_N: "timestamptz",
    SQLValueFunctionOp.SVFOP_LOCALTIME: "time",
    SQLValueFunctionOp.SVFOP_LOCALTIME_N: "time",
    SQLValueFunctionOp.SVFOP_LOCALTIMESTAMP: "timestamp",
    SQLValueFunctionOp.SVFOP_LOCALTIMESTAMP_N: "timestamp",
}
# Sent on the principal's connection, under the principal's search_path: every name is qualified.
_SETTINGS: Final = ("SELECT pg_catalog.set_config('statement_timeout', %s::pg_catalog.text, true), "
                    "pg_catalog.set_config('search_path', 'pg_catalog, pg_temp', true), "
                    "pg_catalog.set_config('TimeZone', 'UTC', true), "
                    "pg_catalog.set_config('DateStyle', 'ISO, MDY', true), "
                    "pg_catalog.set_config('IntervalStyle', 'postgres', true)")


# The reasons quote pieces of the user's text (a token, a name): its control characters are escaped, so a
# reason stays one line wherever it is shown (ERROR_TEXT, the CLI's list of problems, logs).
_ONE_LINE: Final = {c: f"\\x{c:02x}" for c in [*range(32), 127]} | {9: "\\t", 10: "\\n", 13: "\\r"}


class ExpressionRefused(ValueError):
    """The expression is not acceptable; ``str()`` says why, in one line."""

    def __init__(self, reason: str):
        super().__init__(reason.translate(_ONE_LINE))


class EvaluationFailed(Exception):
    """PostgreSQL could not evaluate a checked expression; ``str()`` says why, in one line."""

    def __init__(self, reason: str):
        super().__init__(reason.translate(_ONE_LINE))


@dataclass(frozen=True)
class CheckedExpression:
    """An accepted expression: ``sql`` is the deparsed statement, with ``$1`` for "now"."""

    text: str
    sql: str


def check(text: str) -> CheckedExpression:
    """Accept or refuse ``text``; raises ExpressionRefused naming the first thing not allowed."""
    if not text.strip():
        raise ExpressionRefused("the expression is empty")
    if len(text) > MAX_LENGTH:
        raise ExpressionRefused(f"the expression is longer than {MAX_LENGTH} characters")
    try:
        statements = parse_sql(f"SELECT {text}")
    except ParseError as exc:
        raise ExpressionRefused(_syntax_error(exc)) from None
    if len(statements) != 1:
        raise ExpressionRefused("only one expression is allowed (no statement separators)")
    stmt: Any = statements[0].stmt
    rebuilt = _Rewriter().expr(_select_target(stmt), 0)
    stmt.targetList = (ast.ResTarget(val=_cast(rebuilt, "timestamptz")),)
    deparsed = RawStream()(stmt)
    if len(parse_sql(deparsed)) != 1:  # defence in depth: what runs is one statement
        raise ExpressionRefused("the expression does not deparse to one statement")
    return CheckedExpression(text, deparsed)


def _syntax_error(exc: ParseError) -> str:
    message = str(exc.args[0]) if exc.args else "syntax error"
    if len(exc.args) > 1 and isinstance(exc.args[1], int):
        # the location counts the "SELECT " put in front of the expression
        return f"{message} at character {max(1, exc.args[1] - len('SELECT ') + 1)}"
    return message


def _select_target(stmt: Any) -> Any:
    if not isinstance(stmt, ast.SelectStmt):
        raise ExpressionRefused("only an expression is allowed")
    clauses = ("distinctClause", "intoClause", "fromClause", "whereClause", "groupClause", "havingClause",
               "windowClause", "valuesLists", "sortClause", "limitOffset", "limitCount", "lockingClause",
               "withClause", "larg", "rarg")
    for name in clauses:
        if getattr(stmt, name, None):
            raise ExpressionRefused(f"only an expression is allowed (found {_clause_name(name)})")
    if stmt.op is not None and int(stmt.op) != 0:
        raise ExpressionRefused("only an expression is allowed (found UNION/INTERSECT/EXCEPT)")
    targets = stmt.targetList or ()
    if len(targets) != 1:
        raise ExpressionRefused("exactly one expression is allowed (found a list)")
    target = targets[0]
    if not isinstance(target, ast.ResTarget) or target.val is None:
        raise ExpressionRefused("only an expression is allowed")
    return target.val


def _clause_name(name: str) -> str:
    return {"fromClause": "FROM", "whereClause": "WHERE", "withClause": "WITH", "groupClause": "GROUP BY",
            "havingClause": "HAVING", "sortClause": "ORDER BY", "limitCount": "LIMIT",
            "limitOffset": "OFFSET", "intoClause": "INTO", "lockingClause": "FOR UPDATE",
            "distinctClause": "DISTINCT", "valuesLists": "VALUES", "windowClause": "WINDOW",
            "larg": "UNION/INTERSECT/EXCEPT", "rarg": "UNION/INTERSECT/EXCEPT"}.get(name, name)


def _type_name(*names: str, typmods: tuple[Any, ...] | None = None) -> Any:
    return ast.TypeName(names=tuple(ast.String(sval=n) for n in names), typmods=typmods, typemod=-1)


def _cast(arg: Any, type_name: str, typmods: tuple[Any, ...] | None = None) -> Any:
    return ast.TypeCast(arg=arg, typeName=_type_name("pg_catalog", type_name, typmods=typmods))


def _now(type_name: str = "timestamptz", typmods: tuple[Any, ...] | None = None) -> Any:
    param = _cast(ast.ParamRef(number=1), "timestamptz")
    return param if type_name == "timestamptz" and typmods is None else _cast(param, type_name, typmods)


def _names(node_names: Any) -> list[str]:
    out: list[str] = []
    for item in node_names or ():
        if not isinstance(item, ast.String):
            raise ExpressionRefused("only plain names are allowed")
        out.append(str(item.sval))
    return out


def _unqualified(names: list[str], what: str) -> str:
    """The name, refusing qualification other than pg_catalog."""
    if len(names) == 2 and names[0] == "pg_catalog":
        return names[1]
    if len(names) != 1:
        raise ExpressionRefused(f"qualified {what} names are not allowed: {'.'.join(names)}")
    return names[0]


class _Rewriter:
    """Walks the allow-listed node types, refusing everything else, and substitutes "now"."""

    def expr(self, node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise ExpressionRefused("the expression is nested too deeply")
        handler = getattr(self, f"_{type(node).__name__}", None)
        if handler is None:
            raise ExpressionRefused(f"{_describe(node)} is not allowed{_HINTS.get(type(node).__name__, '')}")
        return handler(node, depth + 1)

    def _list(self, nodes: Any, depth: int) -> tuple[Any, ...] | None:
        return None if nodes is None else tuple(self.expr(n, depth) for n in nodes)

    def _A_Const(self, node: Any, depth: int) -> Any:
        return node

    def _TypeCast(self, node: Any, depth: int) -> Any:
        node.arg = self.expr(node.arg, depth)
        node.typeName = self._type(node.typeName)
        return node

    def _type(self, tn: Any) -> Any:
        if tn.setof or tn.pct_type or tn.arrayBounds:
            raise ExpressionRefused("array, SETOF and %TYPE types are not allowed")
        name = _unqualified(_names(tn.names), "type")
        if name not in ALLOWED_TYPES:
            raise ExpressionRefused(f"type {name} is not allowed")
        for mod in tn.typmods or ():
            if not isinstance(mod, ast.A_Const):
                raise ExpressionRefused("type modifiers must be constants")
        return tn

    def _FuncCall(self, node: Any, depth: int) -> Any:
        names = _names(node.funcname)
        own = len(names) == 2 and names[0] not in _SYSTEM_SCHEMAS
        name = ".".join(names) if own else _unqualified(names, "function")
        if own and names[0].startswith("pg_temp"):
            raise ExpressionRefused(f"function {name}() is not allowed: temporary functions cannot be called")
        if not own and name not in ALLOWED_FUNCTIONS:
            allowed = ", ".join(sorted(ALLOWED_FUNCTIONS))
            raise ExpressionRefused(f"function {name}() is not allowed (allowed: {allowed}); {OWN_FUNCTION_HINT}")
        if (node.agg_order or node.agg_filter or node.over or node.agg_star or node.agg_distinct
                or node.func_variadic or node.agg_within_group):
            raise ExpressionRefused(f"aggregate or window syntax is not allowed in {name}()")
        if not own and name in NOW_FUNCTIONS and not node.args:
            return _now()
        node.args = self._list(node.args, depth)
        if not own and name == "age" and node.args and len(node.args) == 1:
            # age(x) is age(current_date, x): "now" is the parameter here too
            node.args = (_cast(_cast(_now(), "date"), "timestamptz"), node.args[0])
        return node

    def _NamedArgExpr(self, node: Any, depth: int) -> Any:
        node.arg = self.expr(node.arg, depth)
        return node

    def _SQLValueFunction(self, node: Any, depth: int) -> Any:
        type_name = _NOW_TYPES.get(node.op)
        if type_name is None:
            raise ExpressionRefused(f"{node.op.name.removeprefix('SVFOP_')} is not allowed")
        typmods = (ast.A_Const(val=ast.Integer(ival=node.typmod)),) if node.typmod >= 0 else None
        return _now(type_name, typmods)

    def _A_Expr(self, node: Any, depth: int) -> Any:
        kind = node.kind
        if kind not in _ALLOWED_KINDS:
            what = {"AEXPR_OP_ANY": "= ANY (...)", "AEXPR_OP_ALL": "= ALL (...)", "AEXPR_SIMILAR": "SIMILAR TO"}
            name = what.get(kind.name, kind.name.removeprefix("AEXPR_"))
            raise ExpressionRefused(f"{name} is not allowed: use IN (a, b, …), LIKE or a comparison instead")
        if kind in (A_Expr_Kind.AEXPR_OP, A_Expr_Kind.AEXPR_LIKE, A_Expr_Kind.AEXPR_ILIKE):
            op = _unqualified(_names(node.name), "operator")
            if op not in ALLOWED_OPERATORS:
                allowed = " ".join(sorted(ALLOWED_OPERATORS))
                raise ExpressionRefused(f"operator {op} is not allowed (allowed: {allowed})")
        if isinstance(node.rexpr, ast.SubLink):
            raise ExpressionRefused(f"{_describe(node.rexpr)} is not allowed{_HINTS['SubLink']}")
        if node.lexpr is not None:
            node.lexpr = self.expr(node.lexpr, depth)
        if isinstance(node.rexpr, tuple | list):
            node.rexpr = self._list(node.rexpr, depth)
        elif node.rexpr is not None:
            node.rexpr = self.expr(node.rexpr, depth)
        return node

    def _BoolExpr(self, node: Any, depth: int) -> Any:
        if node.boolop not in (BoolExprType.AND_EXPR, BoolExprType.OR_EXPR, BoolExprType.NOT_EXPR):
            raise ExpressionRefused("this boolean expression is not allowed")
        node.args = self._list(node.args, depth)
        return node

    def _NullTest(self, node: Any, depth: int) -> Any:
        node.arg = self.expr(node.arg, depth)
        return node

    def _BooleanTest(self, node: Any, depth: int) -> Any:
        node.arg = self.expr(node.arg, depth)
        return node

    def _CaseExpr(self, node: Any, depth: int) -> Any:
        node.arg = None if node.arg is None else self.expr(node.arg, depth)
        node.args = self._list(node.args, depth)
        node.defresult = None if node.defresult is None else self.expr(node.defresult, depth)
        return node

    def _CaseWhen(self, node: Any, depth: int) -> Any:
        node.expr = self.expr(node.expr, depth)
        node.result = self.expr(node.result, depth)
        return node

    def _CoalesceExpr(self, node: Any, depth: int) -> Any:
        node.args = self._list(node.args, depth)
        return node

    def _MinMaxExpr(self, node: Any, depth: int) -> Any:
        node.args = self._list(node.args, depth)
        return node


_HINTS: Final = {
    "SubLink": f": put the query in a function of your own; {OWN_FUNCTION_HINT}",
    "A_ArrayExpr": ": use IN (a, b, …)",
    "ColumnRef": ": an expression has no columns (quote text constants: 'Mon')",
}


def _describe(node: Any) -> str:
    kind = type(node).__name__
    if isinstance(node, ast.ColumnRef):
        names = ".".join(getattr(f, "sval", "*") for f in node.fields or ())
        return f"a column or name reference ({names})"
    return {"SubLink": "a sub-query", "ParamRef": "a parameter", "A_ArrayExpr": "an array",
            "RowExpr": "a row", "A_Indirection": "subscripting", "CollateClause": "COLLATE",
            "GroupingFunc": "GROUPING"}.get(kind, f"a {kind} node")


async def evaluate(conn: psycopg.AsyncConnection[Any], checked: CheckedExpression, now: dt.datetime, *,
                   timeout_ms: int = 1000) -> dt.datetime | None:
    """The expression's value with ``now`` for the current time; None for NULL.

    Raises EvaluationFailed (a one-line reason) when PostgreSQL refuses it, it times out, or the value is
    not a finite time. ``conn`` is an autocommit connection logged in as the document's principal.
    """
    try:
        async with conn.transaction(force_rollback=True):
            await conn.execute("SET TRANSACTION READ ONLY")
            await conn.execute(_SETTINGS, (str(timeout_ms),))
            cur = psycopg.AsyncRawCursor(conn)
            await cur.execute(checked.sql, [now], prepare=True)
            row = await cur.fetchone()
    except psycopg.DataError as exc:
        if exc.sqlstate is None:  # a value Python cannot hold (infinity, year > 9999)
            raise EvaluationFailed("the value is not a finite time") from None
        raise EvaluationFailed(db_error_text(exc)) from None
    except psycopg.Error as exc:
        if _connection_trouble(exc):
            raise  # not the expression's fault: the caller finishes the task later
        raise EvaluationFailed(db_error_text(exc)) from None
    value = row[0] if row else None
    if value is not None and not isinstance(value, dt.datetime):
        raise EvaluationFailed(f"the value is not a time: {value!r}")
    return value


def _connection_trouble(exc: psycopg.Error) -> bool:
    state = exc.sqlstate or ""
    return isinstance(exc, psycopg.OperationalError) and (not state or (state[:2] in ("08", "57") and state != "57014"))


def db_error_text(exc: psycopg.Error, prefix: str = "") -> str:
    """``[SQLSTATE] message`` in one line; security failures never name the object or role (redacted)."""
    message = exc.diag.message_primary or first_line(exc)
    state = f"[{exc.sqlstate}] " if exc.sqlstate else ""
    return f"{state}{prefix}{retry.redact(retry.classify(exc.sqlstate, message), message)}"
