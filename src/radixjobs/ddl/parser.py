"""Recursive-descent parser for CREATE / ALTER / DROP JOB (SPEC §1); raises only ParseError."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Literal, TypeVar

from radixjobs import model
from radixjobs import schedule as sched
from radixjobs.ddl.tokens import Token, TokenKind
from radixjobs.ddl.types import TypeNameParser
from radixjobs.errors import ParseError, ScheduleError
from radixjobs.model import CallArgument, Constant, JobStatement, QualifiedName

T = TypeVar("T")
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
MIN_EVERY_NS = 1_000_000_000  # the schedule's units start at seconds
MAX_TIMEOUT_MS = 7 * 86_400_000  # radix.max_timeout_ms()
JOB_OPTIONS = ("timeout",)  # WITH (name = value, ...): the options CREATE JOB accepts
_TYPE_STARTERS = ("double", "national", "character", "char", "nchar", "bit", "interval", "timestamp", "time")


def parse_job_statement(text: str) -> JobStatement:
    """Parse one job DDL statement; ParseError (with position and token) for anything else."""
    return _Parser(text).statement()


class _Parser(TypeNameParser):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0

    # ---------------------------------------------------------------------------------------- statements

    def statement(self) -> JobStatement:
        first = self.token
        if first.is_keyword("create"):
            return self.create_job()
        if first.is_keyword("alter"):
            self.advance()
            self.expect("job", "JOB after ALTER")
            name = self.qualified_name("job name", "schema.name")
            enabled = self.enable_flag()
            if enabled is None:
                raise self.expected("ENABLE or DISABLE")
            self.finish()
            return model.AlterJob(name, enabled)
        if first.is_keyword("drop"):
            return self.drop_job()
        if first.is_keyword("run") and self.peek().is_keyword("job"):
            raise self.fail("RUN JOB is not supported in this version", first)
        raise self.expected("CREATE JOB, ALTER JOB or DROP JOB")

    def create_job(self) -> model.CreateJob:
        self.advance()
        if self.token.is_keyword("or"):
            or_token = self.advance()
            self.expect("replace", "REPLACE after OR")
            self.expect("job", "JOB after CREATE OR REPLACE")
            raise self.fail("CREATE OR REPLACE JOB is not supported in this version", or_token)
        self.expect("job", "JOB after CREATE")
        if_not_exists = self.if_clause("not", "exists")
        name = self.qualified_name("job name", "schema.name")
        schedule = self.schedule()
        self.expect("run", "RUN AS")
        self.expect("as", "AS after RUN")
        principal = self.principal()
        self.expect("call", "CALL")
        procedure = self.qualified_name("procedure name", "schema.procedure")
        arguments = self.arguments()
        options = self.with_options() if self.token.is_keyword("with") else {}
        enabled = self.enable_flag()
        what = ("WITH (...), " if not options and enabled is None else "") + (
            "ENABLE, DISABLE, " if enabled is None else "")
        self.finish(what + "';' or end of statement")
        timeout_ms = self.timeout_option(options["timeout"]) if "timeout" in options else None
        return model.CreateJob(name, schedule, principal, procedure, arguments, enabled is not False, if_not_exists,
                               timeout_ms)

    def with_options(self) -> dict[str, tuple[Token, Token]]:
        """``WITH (name = value, ...)``, PostgreSQL's storage-parameter style: every option is parsed the
        same way (a name, '=', one string, number or word), then checked against JOB_OPTIONS."""
        self.advance()
        self.expect_punct("(", "'(' after WITH")
        options: dict[str, tuple[Token, Token]] = {}
        while True:
            name = self.identifier("an option name")
            if name.value not in JOB_OPTIONS:
                accepted = ", ".join(JOB_OPTIONS)
                raise self.fail(f"unknown option \"{name.value}\" (accepted: {accepted})", name)
            if name.value in options:
                raise self.fail(f"option \"{name.value}\" is given more than once", name)
            self.expect_punct("=", f"'=' after option {name.value}")
            value = self.token
            if value.kind not in (TokenKind.STRING, TokenKind.NUMBER, TokenKind.IDENT):
                raise self.expected(f"a value for option {name.value}")
            self.advance()
            options[name.value] = (name, value)
            if self.token.is_punct(")"):
                self.advance()
                return options
            self.expect_punct(",", "',' or ')' after an option")

    def timeout_option(self, option: tuple[Token, Token]) -> int:
        """timeout = '<interval>' (units as in SCHEDULE), at most 7 days; in milliseconds."""
        value = option[1]
        if value.kind is not TokenKind.STRING:
            raise self.fail("timeout must be an interval string, e.g. timeout = '2 hours'", value)
        ns = self.convert(sched.parse_interval, value)
        if ns < 1_000_000:
            raise self.fail(f"timeout '{value.value}' must be at least 1 millisecond", value)
        if ns > MAX_TIMEOUT_MS * 1_000_000:
            raise self.fail(f"timeout '{value.value}' is above the maximum of 7 days", value)
        return ns // 1_000_000

    def drop_job(self) -> model.DropJob:
        self.advance()
        self.expect("job", "JOB after DROP")
        if_exists = self.if_clause("exists")
        name = self.qualified_name("job name", "schema.name")
        behaviour = self.accept("restrict", "cascade")
        self.finish("RESTRICT, CASCADE, ';' or end of statement")
        return model.DropJob(name, if_exists, behaviour is not None and behaviour.value == "cascade")

    def if_clause(self, *words: str) -> bool:
        """IF NOT EXISTS / IF EXISTS; an IF followed by '.' is a schema called "if"."""
        if not self.token.is_keyword("if") or self.peek().is_punct("."):
            return False
        self.advance()
        for word in words:
            self.expect(word, " ".join(w.upper() for w in words) + " after IF")
        return True

    def enable_flag(self) -> bool | None:
        flag = self.accept("enable", "disable")
        return None if flag is None else flag.value == "enable"

    def finish(self, what: str = "';' or end of statement") -> None:
        if self.token.is_punct(";"):
            self.advance()
            if self.token.kind is not TokenKind.EOF:
                found = self.token.describe()
                raise self.fail(f"unexpected {found} after ';': only one statement is allowed")
        elif self.token.kind is not TokenKind.EOF:
            raise self.expected(what)

    # ------------------------------------------------------------------------------------ names, schedule

    def qualified_name(self, what: str, form: str) -> QualifiedName:
        first = self.identifier(what)
        parts = [first.value]
        while self.token.is_punct("."):
            self.advance()
            parts.append(self.identifier(f"a name after '.' in the {what}").value)
        if len(parts) == 1:
            raise self.fail(f"{what} must be schema-qualified ({form})", first)
        if len(parts) > 2:
            raise self.fail(f"{what} has too many dotted parts: use {form}", first)
        return QualifiedName(parts[0], parts[1])

    def principal(self) -> str:
        if self.token.is_keyword("call") and not self.peek().is_keyword("call"):
            raise self.expected("a principal (role name) after RUN AS")
        name = self.identifier("a principal (role name) after RUN AS")
        if self.token.is_punct("."):
            raise self.fail("the principal is a role name and cannot be schema-qualified", name)
        return name.value

    def schedule(self) -> model.Schedule:
        self.expect("schedule", "SCHEDULE")
        if self.accept("every"):
            self.expect("interval", "INTERVAL after EVERY")
            literal = self.string_literal("an interval string")
            interval = self.convert(sched.parse_interval, literal)
            if interval < MIN_EVERY_NS:
                raise self.fail(f"interval '{literal.value}' is shorter than the minimum of 1 second", literal)
            starting_at = None
            if self.accept("starting"):
                self.expect("at", "AT after STARTING")
                starting_at = self.timestamp()
            return model.EverySchedule(interval, starting_at)
        if self.accept("at"):
            return model.AtSchedule(self.timestamp())
        if self.accept("cron"):
            expression = self.string_literal("a cron expression string")
            zone = "UTC"
            if self.accept("time"):
                self.expect("zone", "ZONE after TIME")
                zone_token = self.string_literal("a time zone name string")
                zone = zone_token.value
                self.convert(sched.load_time_zone, zone_token)
            self.convert(lambda text: sched.validate_cron(text, zone), expression)
            return model.CronSchedule(expression.value, zone)
        raise self.expected("EVERY, AT or CRON after SCHEDULE")

    def timestamp(self) -> int:
        self.expect("timestamp", "TIMESTAMP")
        return self.convert(sched.parse_timestamp, self.string_literal("a timestamp string"))

    def convert(self, parse: Callable[[str], T], literal: Token) -> T:
        """Apply a schedule parser to a literal; its ScheduleError becomes a ParseError at the literal."""
        try:
            return parse(literal.value)
        except ScheduleError as exc:
            raise self.fail(str(exc), literal) from None

    # ---------------------------------------------------------------------------------------- arguments

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
