"""The expression checker's walk (expression.py runs it): what an INTERVAL expression may be built from.

Accepted: exactly one plain SELECT target, built only from allow-listed node types, operators (IN, IS
DISTINCT FROM, LIKE, BETWEEN included), types and functions, unqualified (or with the ``pg_catalog.`` the
grammar itself writes) — and a function qualified by a schema of the database's own
(``myschema.next_time(now())``): the principal's own code, resolved in that schema only, run as the
principal under the evaluation's guarantees, as DB_FUNCTION runs any code of its own. A sub-query reads the
principal's tables the same way: ``(SELECT … FROM myschema.t …)`` or ``EXISTS (…)``, over schema-qualified
tables and views of the database's own schemas; every expression in it is checked by the same rules (columns,
and the aggregates count, min, max, sum, avg, bool_and, bool_or, are allowed in a sub-query only); it has no
WITH, set operation, locking clause, DISTINCT, or function or sub-query in FROM. Never a temporary function
or table, a system schema's table, or a system schema's function outside the allow-list.

"Now" (``now()``, ``CURRENT_TIMESTAMP``, ``clock_timestamp()``…) becomes the parameter ``$1``.

Depth: every node is a level, but a run of binary operators (``a + b + c …``, left-deep as parsed) is one
level, walked in a loop, and AND/OR lists are flat already. MAX_DEPTH bounds the nesting, so the walk's and
the printer's (deparse.py) recursion stay far below Python's limit whatever MAX_LENGTH characters hold.
"""

from __future__ import annotations

from typing import Any, Final

from pglast import ast
from pglast.enums.parsenodes import A_Expr_Kind
from pglast.enums.primnodes import BoolExprType, SQLValueFunctionOp, SubLinkType

from radixjobs.documents.deparse import operator_run

MAX_LENGTH: Final = 2000
MAX_DEPTH: Final = 64

ALLOWED_FUNCTIONS: Final = frozenset({
    "now", "transaction_timestamp", "statement_timestamp", "clock_timestamp",
    "date_trunc", "date_part", "extract", "date_bin", "date_add", "date_subtract", "timezone", "isfinite",
    "make_interval", "make_date", "make_time", "make_timestamp", "make_timestamptz",
    "to_timestamp", "to_date", "justify_days", "justify_hours", "justify_interval",
    "abs", "ceil", "ceiling", "floor", "round", "trunc", "mod",
    "age", "to_char", "to_number", "lower", "upper", "length", "char_length", "substr", "substring",
    "btrim", "ltrim", "rtrim", "concat", "left", "right", "strpos", "position", "random",
})
# allowed in a sub-query only, where there are rows to aggregate
AGGREGATES: Final = frozenset({"count", "min", "max", "sum", "avg", "bool_and", "bool_or"})
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
OWN_FUNCTION_HINT: Final = ("for a function of your own, write it schema-qualified (myschema.next_time(...)): "
                            "it runs as RUN_AS, read-only and under the timeout")
SUBQUERY_HINT: Final = "read a table with (SELECT … FROM myschema.t …) or EXISTS (SELECT … FROM myschema.t …)"
# clauses a sub-query may not have (a FROM it must have)
_QUERY_REFUSED: Final = ("withClause", "larg", "rarg", "lockingClause", "intoClause", "distinctClause",
                         "windowClause", "valuesLists")
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
# The reasons quote pieces of the user's text (a token, a name): its control characters are escaped, so a
# reason stays one line wherever it is shown (ERROR_TEXT, the CLI's list of problems, logs).
ONE_LINE: Final = {c: f"\\x{c:02x}" for c in [*range(32), 127]} | {9: "\\t", 10: "\\n", 13: "\\r"}


class ExpressionRefused(ValueError):
    """The expression is not acceptable; ``str()`` says why, in one line."""

    def __init__(self, reason: str):
        super().__init__(reason.translate(ONE_LINE))


def rewrite(stmt: Any) -> None:
    """Check ``SELECT <expression>`` in place and make it ``SELECT CAST(<expression> AS timestamptz)``, "now"
    replaced by ``$1``; raises ExpressionRefused naming the first thing not allowed."""
    rebuilt = _Rewriter().expr(_select_target(stmt), 0)
    stmt.targetList = (ast.ResTarget(val=_cast(rebuilt, "timestamptz")),)


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
            "limitOffset": "OFFSET", "intoClause": "INTO", "lockingClause": "FOR UPDATE/SHARE",
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


def _system_schema(schema: str) -> bool:
    """pg_catalog, pg_toast, pg_temp_N… (PostgreSQL keeps pg_* for itself) and information_schema."""
    return schema.startswith("pg_") or schema == "information_schema"


class _Rewriter:
    """Walks the allow-listed node types, refusing everything else, and substitutes "now". ``queries``:
    how many sub-queries enclose the node (columns and aggregates are allowed in one only)."""

    def __init__(self) -> None:
        self.queries = 0

    def expr(self, node: Any, depth: int) -> Any:
        _within_depth(depth)
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
        if len(names) == 2 and names[0].startswith("pg_temp"):
            raise ExpressionRefused(f"function {'.'.join(names)}() is not allowed: temporary functions cannot be "
                                    "called")
        own = len(names) == 2 and not _system_schema(names[0])
        name = ".".join(names) if own else _unqualified(names, "function")
        aggregate = not own and name in AGGREGATES
        if aggregate and not self.queries:
            raise ExpressionRefused(f"function {name}() is not allowed outside a sub-query: an aggregate needs rows; "
                                    f"{SUBQUERY_HINT}")
        if not own and not aggregate and name not in ALLOWED_FUNCTIONS:
            allowed = ", ".join(sorted(ALLOWED_FUNCTIONS))
            raise ExpressionRefused(f"function {name}() is not allowed (allowed: {allowed}); {OWN_FUNCTION_HINT}")
        if (node.agg_order or node.over or node.func_variadic or node.agg_within_group
                or (not aggregate and (node.agg_filter or node.agg_star or node.agg_distinct))):
            raise ExpressionRefused(f"aggregate or window syntax is not allowed in {name}()")
        if not own and name in NOW_FUNCTIONS and not node.args:
            return _now()
        node.args = self._list(node.args, depth)
        node.agg_filter = None if node.agg_filter is None else self.expr(node.agg_filter, depth)
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
        # a run of binary operators (a + b - c …, left-deep as parsed) is one level, walked in a loop
        run = operator_run(node) or [node]
        for link in run:
            _check_operator(link)
        first = run[-1]
        if first.lexpr is not None:
            first.lexpr = self.expr(first.lexpr, depth)
        for link in reversed(run):
            if isinstance(link.rexpr, tuple | list):
                link.rexpr = self._list(link.rexpr, depth)
            elif link.rexpr is not None:
                link.rexpr = self.expr(link.rexpr, depth)
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

    # -- sub-queries: the principal's tables, read as the principal --------------------------------------

    def _SubLink(self, node: Any, depth: int) -> Any:
        if node.subLinkType not in (SubLinkType.EXPR_SUBLINK, SubLinkType.EXISTS_SUBLINK):
            raise ExpressionRefused(f"a sub-query is not allowed with IN, ANY, ALL or ARRAY: {SUBQUERY_HINT}")
        node.subselect = self._query(node.subselect, depth + 1)
        return node

    def _query(self, stmt: Any, depth: int) -> Any:
        if not isinstance(stmt, ast.SelectStmt):
            raise ExpressionRefused("only a SELECT is allowed in a sub-query")
        for name in _QUERY_REFUSED:
            if getattr(stmt, name, None):
                raise ExpressionRefused(f"{_clause_name(name)} is not allowed in a sub-query")
        if not stmt.fromClause:
            raise ExpressionRefused("a sub-query is not allowed without FROM (write the expression itself, or put "
                                    f"the query in a function of your own); {SUBQUERY_HINT}")
        targets = stmt.targetList or ()
        if len(targets) != 1 or targets[0].val is None or targets[0].indirection:
            raise ExpressionRefused("a sub-query must select exactly one value")
        self.queries += 1
        try:
            stmt.fromClause = tuple(self._from_item(item, depth) for item in stmt.fromClause)
            targets[0].val = self.expr(targets[0].val, depth)
            for clause in ("whereClause", "havingClause", "limitCount", "limitOffset"):
                if getattr(stmt, clause) is not None:
                    setattr(stmt, clause, self.expr(getattr(stmt, clause), depth))
            stmt.groupClause = self._list(stmt.groupClause, depth)
            for sort in stmt.sortClause or ():
                if sort.useOp:
                    raise ExpressionRefused("ORDER BY … USING is not allowed in a sub-query")
                sort.node = self.expr(sort.node, depth)
        finally:
            self.queries -= 1
        return stmt

    def _from_item(self, node: Any, depth: int) -> Any:
        _within_depth(depth)
        if isinstance(node, ast.RangeVar):
            _check_table(node)
        elif isinstance(node, ast.JoinExpr):
            node.larg = self._from_item(node.larg, depth + 1)
            node.rarg = self._from_item(node.rarg, depth + 1)
            node.quals = None if node.quals is None else self.expr(node.quals, depth + 1)
        else:
            raise ExpressionRefused(f"{_describe(node)} in FROM is not allowed: list tables (myschema.t), joined if "
                                    "need be")
        return node

    def _ColumnRef(self, node: Any, depth: int) -> Any:
        if not self.queries:
            raise ExpressionRefused(f"{_describe(node)} is not allowed{_HINTS['ColumnRef']}")
        fields = node.fields or ()
        if not all(isinstance(f, ast.String) or (isinstance(f, ast.A_Star) and i == len(fields) - 1)
                   for i, f in enumerate(fields)):
            raise ExpressionRefused("only plain column names are allowed")
        return node


def _within_depth(depth: int) -> None:
    if depth > MAX_DEPTH:
        raise ExpressionRefused(f"the expression is nested too deeply (more than {MAX_DEPTH} levels)")


def _check_operator(node: Any) -> None:
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


def _check_table(node: Any) -> None:
    """A table or view of the database's own schemas, schema-qualified (the search_path is pg_catalog)."""
    name = ".".join(n for n in (node.catalogname, node.schemaname, node.relname) if n)
    if node.catalogname:
        raise ExpressionRefused(f"table {name} is not allowed: a database name cannot be given")
    if not node.schemaname:
        raise ExpressionRefused(f"table {name} must be qualified by its schema (myschema.{name}): the search_path "
                                "of an expression is pg_catalog")
    if node.schemaname.startswith("pg_temp"):
        raise ExpressionRefused(f"table {name} is not allowed: temporary tables cannot be read")
    if _system_schema(node.schemaname):
        raise ExpressionRefused(f"table {name} is not allowed: read tables of your own schemas")


_HINTS: Final = {
    "A_ArrayExpr": ": use IN (a, b, …)",
    "ColumnRef": f": an expression has no columns (quote text constants: 'Mon'); {SUBQUERY_HINT}",
}


def _describe(node: Any) -> str:
    kind = type(node).__name__
    if isinstance(node, ast.ColumnRef):
        names = ".".join(getattr(f, "sval", "*") for f in node.fields or ())
        return f"a column or name reference ({names})"
    return {"SubLink": "a sub-query", "ParamRef": "a parameter", "A_ArrayExpr": "an array",
            "RowExpr": "a row", "A_Indirection": "subscripting", "CollateClause": "COLLATE",
            "GroupingFunc": "GROUPING", "RangeSubselect": "a sub-query", "RangeFunction": "a function",
            "RangeTableSample": "TABLESAMPLE", "RangeTableFunc": "XMLTABLE"}.get(kind, f"a {kind} node")
