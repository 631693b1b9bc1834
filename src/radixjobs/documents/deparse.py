"""Printing a checked expression tree back to SQL: pglast's printer, with runs of binary operators in a loop.

pglast prints a tree by recursion, a handful of Python frames per node, and PostgreSQL parses ``a + b + c``
left-deep: a sum of 200 terms is a tree 200 levels deep, past Python's recursion limit. Here a run of binary
operators (``a + b - c || d``: each one's left operand the next) is printed term by term, every term in
parentheses and each step closed as it is printed, ``(((a) + (b)) - (c))``, which PostgreSQL reads as the same
left-deep tree. So the printer's recursion follows the nesting the checker bounds (expression.MAX_DEPTH), never
the length of a sum, and what is printed still comes from the checked tree only.
"""

from __future__ import annotations

from typing import Any

from pglast import ast
from pglast.enums.parsenodes import A_Expr_Kind
from pglast.precedence import ExprContext
from pglast.stream import RawStream


def binary_operator(node: Any) -> bool:
    """Is ``node`` a plain binary operator (``a + b``), a link of a run?"""
    return (isinstance(node, ast.A_Expr) and node.kind == A_Expr_Kind.AEXPR_OP
            and node.lexpr is not None and node.rexpr is not None)


def operator_run(node: Any) -> list[Any]:
    """The run of binary operators from ``node`` down its left operands: [node, node.lexpr, …]; empty when
    ``node`` is no binary operator. The last link's ``lexpr`` is the run's first term."""
    run: list[Any] = []
    while binary_operator(node):
        run.append(node)
        node = node.lexpr
    return run


def _operator_text(node: Any) -> str:
    names = [str(n.sval) for n in node.name]
    return names[-1] if len(names) == 1 else f"OPERATOR({'.'.join(names)})"


class _Stream(RawStream):
    """RawStream that prints a run of two or more binary operators in a loop."""

    def print_node(self, node: Any, is_name: bool = False, is_symbol: bool = False) -> None:
        run = [] if is_name or is_symbol else operator_run(node)
        if len(run) < 2:
            super().print_node(node, is_name, is_symbol)
            return
        self.write("(" * len(run))
        self._term(run[-1].lexpr)
        for link in reversed(run):
            self.write(f" {_operator_text(link)} ")
            self._term(link.rexpr)
            self.write(")")

    def _term(self, node: Any) -> None:
        with self.expression(True), self.push_expr_context(ExprContext.A_EXPR):
            self.print_node(node)


def deparse(stmt: Any) -> str:
    """The SQL text of a statement tree."""
    return str(_Stream()(stmt))
