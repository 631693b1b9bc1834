"""Recursive-descent parser for the job DDL (SPEC §1): CREATE [OR REPLACE] / ALTER / DROP / RUN JOB; raises
only ParseError. The CALL clause's constants are parsed by :mod:`radixjobs.ddl.constants`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from radixjobs import model
from radixjobs import schedule as sched
from radixjobs.ddl.constants import ConstantParser
from radixjobs.ddl.tokens import Token, TokenKind
from radixjobs.errors import ScheduleError
from radixjobs.model import JobStatement, QualifiedName

T = TypeVar("T")
MIN_EVERY_NS = 1_000_000_000  # the schedule's units start at seconds
MAX_TIMEOUT_MS = 7 * 86_400_000  # radix.max_timeout_ms()
JOB_OPTIONS = ("timeout",)  # WITH (name = value, ...): the options CREATE JOB accepts


def parse_job_statement(text: str) -> JobStatement:
    """Parse one job DDL statement; ParseError (with position and token) for anything else."""
    return _Parser(text).statement()


class _Parser(ConstantParser):
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
