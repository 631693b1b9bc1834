"""Argument constants of a CALL clause: numbers, strings, booleans, NULL, typed literals, casts and ARRAY[...]
of those; anything else (operators, function calls, sub-queries, parameters) is refused at its token."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from radixjobs.ddl.tokens import Token, TokenKind
from radixjobs.ddl.types import TypeNameParser
from radixjobs.errors import ParseError
from radixjobs.model import CallArgument, Constant

MAX_NESTING = 64
_CONSTANTS_ONLY = "arguments must be constants"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_SUBQUERY_WORDS = _words("select values with table exists")
_VALUE_FUNCTIONS = "current_date current_time current_timestamp localtime localtimestamp current_user"
_VALUE_FUNCTIONS += " current_role session_user user current_schema current_catalog system_user"
_REJECTED_WORDS = dict.fromkeys(_SUBQUERY_WORDS, "sub-queries are not allowed as")
_REJECTED_WORDS |= dict.fromkeys(_VALUE_FUNCTIONS.split(), "function calls are not allowed as")
_REJECTED_WORDS |= {"not": "operators are not allowed in", "case": "CASE expressions are not allowed in"}
_REJECTED_WORDS |= {"row": "row constructors are not allowed as"}
_OPERATOR_WORDS = _words("and or not is isnull notnull in like ilike similar between collate at overlaps")
_TYPE_STARTERS = ("double", "national", "character", "char", "nchar", "bit", "interval", "timestamp", "time")


class ConstantParser(TypeNameParser):
    """The CALL clause's argument list; nesting (parentheses, arrays) is bounded by MAX_NESTING."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0

    def arguments(self) -> tuple[CallArgument, ...]:
        self.expect_punct("(", "'(' after the procedure name")
        arguments: list[CallArgument] = []
        if self.token.is_punct(")"):
            self.advance()
            return ()
        while True:
            arguments.append(self.argument(arguments))
            if self.token.is_punct(","):
                self.advance()
            elif self.token.is_punct(")"):
                self.advance()
                return tuple(arguments)
            else:
                raise self.after_value("',' or ')' after an argument")

    def argument(self, previous: list[CallArgument]) -> CallArgument:
        start = self.token
        if start.kind in (TokenKind.IDENT, TokenKind.QUOTED_IDENT) and self.peek().is_punct("=>"):
            if any(arg.name == start.value for arg in previous):
                raise self.fail(f"argument name '{start.value}' is used more than once", start)
            self.advance()
            self.advance()
            return CallArgument(self.constant(), start.value)
        if previous and previous[-1].name is not None:
            raise self.fail("positional argument cannot follow named argument", start)
        return CallArgument(self.constant())

    def after_value(self, what: str) -> ParseError:
        token = self.token
        if token.kind is TokenKind.OPERATOR or token.is_keyword(*_OPERATOR_WORDS):
            return self.fail(f"operators are not allowed in job arguments: {_CONSTANTS_ONLY}")
        if token.is_punct("["):
            return self.fail(f"subscripts are not allowed in job arguments: {_CONSTANTS_ONLY}")
        return self.expected(what)

    def constant(self) -> Constant:
        """A constant, then any number of ``::type`` casts (outermost type, innermost literal kept)."""
        self.nest()
        value = self.operand()
        while self.token.is_punct("::"):
            self.advance()
            value = _cast(value, self.type_name())
        self.depth -= 1
        return value

    def nest(self) -> None:
        self.depth += 1
        if self.depth > MAX_NESTING:
            raise self.fail(f"argument nested too deeply (more than {MAX_NESTING} levels)")

    def operand(self) -> Constant:
        token = self.token
        if token.is_punct("-", "+"):
            return self.signed_number()
        if token.kind is TokenKind.NUMBER:
            self.advance()
            return Constant(_number_kind(token.text), token.text)
        if token.kind is TokenKind.STRING:
            self.advance()
            return Constant("string", token.value)
        if token.kind is TokenKind.PARAM:
            raise self.fail(f"parameters ({token.text}) are not allowed as job arguments: {_CONSTANTS_ONLY}")
        if token.is_punct("("):
            return self.parenthesised()
        if token.kind is TokenKind.IDENT:
            return self.keyword_operand(token)
        if token.kind is TokenKind.QUOTED_IDENT:
            return self.typed_literal()
        raise self.expected("an argument value")

    def signed_number(self) -> Constant:
        # PostgreSQL binds '::' tighter than unary minus, so -5::int is -(5::int); we keep the sign with
        # the literal instead (typed value "-5", type "int"): the same value for every numeric type.
        sign = self.advance()
        number = self.token
        if number.kind is not TokenKind.NUMBER:
            word = "minus" if sign.text == "-" else "plus"
            raise self.fail(f"unary {word} applies only to numeric literals: {_CONSTANTS_ONLY}", sign)
        self.advance()
        return Constant(_number_kind(number.text), ("-" if sign.text == "-" else "") + number.text)

    def parenthesised(self) -> Constant:
        self.advance()
        if self.token.is_keyword(*_SUBQUERY_WORDS):
            raise self.fail(f"sub-queries are not allowed as job arguments: {_CONSTANTS_ONLY}")
        value = self.constant()
        if self.token.is_punct(","):
            raise self.fail(f"row constructors are not allowed as job arguments: {_CONSTANTS_ONLY}")
        if not self.token.is_punct(")"):
            raise self.after_value("')'")
        self.advance()
        return value

    def keyword_operand(self, token: Token) -> Constant:
        word = token.value
        if word in ("true", "false", "null"):
            self.advance()
            return Constant("null") if word == "null" else Constant("boolean", word)
        if word == "array":
            return self.array_constructor()
        if word == "cast":
            return self.cast_expression()
        if word == "default":
            raise self.fail("DEFAULT is not allowed as a job argument: omit the argument to use its default")
        rejected = _REJECTED_WORDS.get(word)
        if rejected is not None:
            raise self.fail(f"{rejected} job arguments: {_CONSTANTS_ONLY}")
        return self.typed_literal()

    def typed_literal(self) -> Constant:
        """``typename 'literal'``; a name followed by anything else is a column reference or a call."""
        start, saved = self.token, self.index
        try:
            type_name = self.type_name(allow_array=False)
            literal = self.string_literal(f"a string literal after type name '{type_name}'")
        except ParseError:
            if start.is_keyword(*_TYPE_STARTERS):
                raise  # double precision, timestamp with time zone…: the type parser's message is precise
            self.index = saved
            raise self.not_a_constant() from None
        if type_name == "interval":
            type_name += self.interval_fields()
        return Constant("typed", literal.value, type_name)

    def not_a_constant(self) -> ParseError:
        """The error for a (dotted) name that does not start a typed literal."""
        after = self.index + 1
        while self.tokens[after].is_punct(".") and self.tokens[after + 1].kind is not TokenKind.EOF:
            after += 2
        if self.tokens[after].is_punct("("):
            return self.fail(f"function calls are not allowed as job arguments: {_CONSTANTS_ONLY}")
        return self.fail(
            f"column references are not allowed as job arguments: {_CONSTANTS_ONLY} "
            "(write text as a quoted string, 'like this')"
        )

    def array_constructor(self) -> Constant:
        array = self.advance()
        if self.token.is_punct("("):
            raise self.fail(f"sub-queries are not allowed as job arguments: {_CONSTANTS_ONLY}")
        self.expect_punct("[", "'[' after ARRAY")
        elements = self.array_elements()
        if not elements and not self.token.is_punct("::"):
            raise self.fail("cannot determine the type of an empty array: write ARRAY[]::type[]", array)
        return Constant("array", elements=elements)

    def array_elements(self) -> tuple[Constant, ...]:
        """Elements up to and including the closing ']'; a bare '[' opens a nested array."""
        elements: list[Constant] = []
        while not self.token.is_punct("]"):
            if elements:
                if not self.token.is_punct(","):
                    raise self.after_value("',' or ']' in ARRAY[...]")
                self.advance()
            if self.token.is_punct("["):
                self.nest()
                self.advance()
                elements.append(Constant("array", elements=self.array_elements()))
                self.depth -= 1
            else:
                elements.append(self.constant())
        self.advance()
        return tuple(elements)

    def cast_expression(self) -> Constant:
        self.advance()
        self.expect_punct("(", "'(' after CAST")
        value = self.constant()
        if not self.token.is_keyword("as"):
            raise self.after_value("AS in CAST(... AS type)")
        self.advance()
        value = _cast(value, self.type_name())
        self.expect_punct(")", "')' to close CAST(")
        return value


def _number_kind(text: str) -> Literal["integer", "numeric"]:
    return "integer" if text.isdigit() else "numeric"


def _cast(value: Constant, type_name: str) -> Constant:
    """``value::type_name``: arrays keep their elements; everything else becomes a typed literal."""
    if value.kind == "array":
        return replace(value, type_name=type_name)
    return Constant("typed", value.value, type_name)
