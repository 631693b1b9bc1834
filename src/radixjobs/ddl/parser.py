"""Recursive-descent parser for the job DDL (SPEC §1): CREATE [OR REPLACE] / ALTER / DROP / RUN JOB, and
CREATE / ALTER / DROP JOB GROUP; raises only ParseError.
The CALL clause's constants are parsed by :mod:`radixjobs.ddl.constants`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar, cast

from radixjobs import model
from radixjobs import schedule as sched
from radixjobs.ddl.constants import ConstantParser
from radixjobs.ddl.options import JOB_OPTIONS, check_max_running, check_option
from radixjobs.ddl.tokens import Token, TokenKind
from radixjobs.errors import ScheduleError
from radixjobs.model import JobStatement, QualifiedName

T = TypeVar("T")
MIN_EVERY_NS = 1_000_000_000  # the schedule's units start at seconds


def parse_job_statement(text: str) -> JobStatement:
    """Parse one job DDL statement; ParseError (with position and token) for anything else."""
    return _Parser(text).statement()


class _Parser(ConstantParser):
    # ---------------------------------------------------------------------------------------- statements

    def statement(self) -> JobStatement:
        first = self.token
        if first.is_keyword("create", "alter", "drop") and self.peek().is_keyword("job") \
                and self.peek(2).is_keyword("group") and not self.peek(3).is_punct("."):
            return self.group_statement()
        if first.is_keyword("create"):
            return self.create_job()
        if first.is_keyword("alter"):
            return self.alter_job()
        if first.is_keyword("drop"):
            return self.drop_job()
        if first.is_keyword("run") and self.peek().is_keyword("job"):
            return self.run_job()
        raise self.expected("CREATE JOB, ALTER JOB, DROP JOB or RUN JOB")

    def create_job(self) -> model.CreateJob:
        self.advance()
        or_replace = False
        if self.token.is_keyword("or"):
            self.advance()
            self.expect("replace", "REPLACE after OR")
            or_replace = True
        self.expect("job", "JOB after CREATE OR REPLACE" if or_replace else "JOB after CREATE")
        if_token = self.token
        if_not_exists = self.if_clause("not", "exists")
        if if_not_exists and or_replace:
            raise self.fail("CREATE OR REPLACE JOB cannot take IF NOT EXISTS", if_token)
        name = self.qualified_name("job name", "schema.name")
        schedule, zone_given = self.schedule()
        self.expect("run", "RUN AS")
        self.expect("as", "AS after RUN")
        principal = self.principal()
        self.expect("call", "CALL")
        procedure = self.qualified_name("procedure name", "schema.procedure")
        arguments = self.arguments()
        options = self.options("with") if self.token.is_keyword("with") else {}
        enabled = self.enable_flag()
        what = ("WITH (...), " if not options and enabled is None else "") + (
            "ENABLE, DISABLE, " if enabled is None else "")
        self.finish(what + "';' or end of statement")
        schedule = self.zoned(schedule, zone_given, options)
        timeout = options.pop("timeout", None)
        return model.CreateJob(name, schedule, principal, procedure, arguments, enabled is not False, if_not_exists,
                               None if timeout is None else int(timeout[1]),
                               tuple((k, v) for k, (_, v) in options.items()), or_replace)

    def alter_job(self) -> model.AlterJob:
        """ALTER JOB name action [, action …]; actions: ENABLE, DISABLE, SET SCHEDULE …, SET RUN AS role,
        SET CALL proc(…), SET (option = value, …), RESET (option, …); or RENAME TO schema.name alone."""
        self.advance()
        self.expect("job", "JOB after ALTER")
        name = self.qualified_name("job name", "schema.name")
        if self.accept("rename"):
            self.expect("to", "TO after RENAME")
            new_name = self.qualified_name("new job name", "schema.name")
            self.finish()
            return model.AlterJob(name, rename_to=new_name)
        change = _AlterChanges()
        while True:
            start = self.token
            if not change.take(self.alter_action()):
                raise self.fail("this is changed more than once in the statement", start)
            if not self.token.is_punct(","):
                break
            self.advance()
        self.finish("',' and another action, ';' or end of statement")
        schedule = None if change.schedule is None else self.zoned(*change.schedule, change.options)
        timeout = change.options.get("timeout")
        options = [(k, v) for k, (_, v) in change.options.items()]
        if timeout is not None:
            options = [(k, v) for k, v in options if k != "timeout"] + [("timeout", int(timeout[1]))]
        procedure, arguments = change.call if change.call is not None else (None, ())
        return model.AlterJob(name, change.enabled, schedule, change.principal, procedure, arguments,
                              tuple(options), change.reset)

    def alter_action(self) -> tuple[str, object]:
        flag = self.enable_flag()
        if flag is not None:
            return "enabled", flag
        if self.accept("reset"):
            return "reset", self.reset_names()
        if not self.accept("set"):
            raise self.expected("ENABLE, DISABLE, SET, RESET or RENAME TO")
        if self.token.is_keyword("schedule"):
            return "schedule", self.schedule()
        if self.accept("run"):
            self.expect("as", "AS after SET RUN")
            return "principal", self.principal()
        if self.accept("call"):
            procedure = self.qualified_name("procedure name", "schema.procedure")
            return "call", (procedure, self.arguments())
        if self.token.is_punct("("):
            return "options", self.options(None)
        raise self.expected("SCHEDULE, RUN AS, CALL or '(' after SET")

    def group_statement(self) -> model.GroupStatement:
        """CREATE JOB GROUP [IF NOT EXISTS] name WITH (max_running = N); ALTER JOB GROUP name SET
        (max_running = N) | RESET (max_running); DROP JOB GROUP [IF EXISTS] name."""
        verb = self.advance().value
        self.advance()  # JOB
        self.advance()  # GROUP
        if verb == "drop":
            if_exists = self.if_clause("exists")
            name = self.group_name()
            self.finish()
            return model.DropJobGroup(name, if_exists)
        if verb == "create":
            if_not_exists = self.if_clause("not", "exists")
            name = self.group_name()
            self.expect("with", "WITH (max_running = N)")
            cap = self.max_running()
            self.finish()
            return model.CreateJobGroup(name, cap, if_not_exists)
        name = self.group_name()
        if self.accept("reset"):
            self.expect_punct("(", "'(' after RESET")
            self.expect("max_running", "max_running (the only job group option)")
            self.expect_punct(")", "')' after max_running")
            self.finish()
            return model.AlterJobGroup(name, None)
        self.expect("set", "SET (max_running = N) or RESET (max_running)")
        cap = self.max_running()
        self.finish()
        return model.AlterJobGroup(name, cap)

    def group_name(self) -> str:
        name = self.identifier("a job group name")
        if self.token.is_punct("."):
            raise self.fail("a job group name is one identifier and cannot be schema-qualified", name)
        return name.value

    def max_running(self) -> int:
        """``(max_running = N)``, the one job group option."""
        self.expect_punct("(", "'(' and the job group's options")
        self.expect("max_running", "max_running (the only job group option)")
        self.expect_punct("=", "'=' after max_running")
        value = self.token
        self.advance()
        cap = check_max_running(value, self.fail)
        self.expect_punct(")", "')' after the option (max_running is the only one)")
        return cap

    def run_job(self) -> model.RunJob:
        self.advance()
        self.advance()  # JOB
        name = self.qualified_name("job name", "schema.name")
        if not self.accept("for"):
            self.finish("FOR RANGE, ';' or end of statement")
            return model.RunJob(name)
        self.expect("range", "RANGE after FOR")
        start_token = self.token
        start = self.timestamp()
        self.expect("to", "TO after the range's start")
        end = self.timestamp()
        if end <= start:
            raise self.fail("the range's end must be after its start", start_token)
        self.finish()
        return model.RunJob(name, start, end)

    def options(self, keyword: str | None) -> dict[str, tuple[Token, str | int]]:
        """``WITH (name = value, ...)`` (keyword "with") or ``SET (...)``: every option is parsed the same
        way (a name, '=', one string, number or word), then checked (ddl.options)."""
        if keyword is not None:
            self.advance()
        self.expect_punct("(", f"'(' after {keyword.upper() if keyword else 'SET'}")
        options: dict[str, tuple[Token, str | int]] = {}
        while True:
            name = self.option_name(options)
            self.expect_punct("=", f"'=' after option {name.value}")
            value = self.token
            if value.kind not in (TokenKind.STRING, TokenKind.NUMBER, TokenKind.IDENT):
                raise self.expected(f"a value for option {name.value}")
            self.advance()
            options[name.value] = (name, check_option(name, value, self.fail))
            if self.token.is_punct(")"):
                self.advance()
                return options
            self.expect_punct(",", "',' or ')' after an option")

    def reset_names(self) -> tuple[str, ...]:
        self.expect_punct("(", "'(' after RESET")
        names: dict[str, tuple[Token, str | int]] = {}
        while True:
            name = self.option_name(names)
            names[name.value] = (name, "")
            if self.token.is_punct(")"):
                self.advance()
                return tuple(names)
            self.expect_punct(",", "',' or ')' after an option name")

    def option_name(self, seen: dict[str, tuple[Token, str | int]]) -> Token:
        name = self.identifier("an option name")
        if name.value not in JOB_OPTIONS:
            raise self.fail(f"unknown option \"{name.value}\" (accepted: {', '.join(JOB_OPTIONS)})", name)
        if name.value in seen:
            raise self.fail(f"option \"{name.value}\" is given more than once", name)
        return name

    def zoned(self, schedule: model.Schedule, zone_given: bool,
              options: dict[str, tuple[Token, str | int]]) -> model.Schedule:
        """Apply WITH (time_zone = …) to a CRON schedule without TIME ZONE; refuse it anywhere else."""
        if "time_zone" not in options:
            return schedule
        token, zone = options.pop("time_zone")
        if not isinstance(schedule, model.CronSchedule):
            raise self.fail("option time_zone applies to CRON schedules only", token)
        if zone_given:
            raise self.fail("the time zone is given twice (TIME ZONE and time_zone)", token)
        return replace(schedule, time_zone=str(zone))

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

    def schedule(self) -> tuple[model.Schedule, bool]:
        """The schedule, and whether a CRON schedule named its TIME ZONE."""
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
            return model.EverySchedule(interval, starting_at), False
        if self.accept("at"):
            return model.AtSchedule(self.timestamp()), False
        if self.accept("cron"):
            expression = self.string_literal("a cron expression string")
            zone = "UTC"
            zone_given = self.token.is_keyword("time")
            if self.accept("time"):
                self.expect("zone", "ZONE after TIME")
                zone_token = self.string_literal("a time zone name string")
                zone = zone_token.value
                self.convert(sched.load_time_zone, zone_token)
            self.convert(lambda text: sched.validate_cron(text, zone), expression)
            return model.CronSchedule(expression.value, zone), zone_given
        if self.accept("after"):
            return model.AfterSchedule(self.upstreams()), False
        raise self.expected("EVERY, AT, CRON or AFTER after SCHEDULE")

    def upstreams(self) -> tuple[model.Upstream, ...]:
        """``name [SUCCEEDS | FAILS | COMPLETES] [AND name …]`` after SCHEDULE AFTER."""
        edges: list[model.Upstream] = []
        while True:
            first = self.token
            job = self.qualified_name("an upstream job", "SCHEDULE AFTER schema.job")
            if any(edge.job == job for edge in edges):
                raise self.fail(f"upstream {job} is named twice", first)
            condition = self.accept("succeeds", "fails", "completes")
            edges.append(model.Upstream(job, cast(model.Condition, condition.value if condition else "succeeds")))
            if not self.accept("and"):
                return tuple(edges)

    def timestamp(self) -> int:
        self.expect("timestamp", "TIMESTAMP")
        return self.convert(sched.parse_timestamp, self.string_literal("a timestamp string"))

    def convert(self, parse: Callable[[str], T], literal: Token) -> T:
        """Apply a schedule parser to a literal; its ScheduleError becomes a ParseError at the literal."""
        try:
            return parse(literal.value)
        except ScheduleError as exc:
            raise self.fail(str(exc), literal) from None


@dataclass
class _AlterChanges:
    """The actions of one ALTER JOB statement, each at most once."""

    enabled: bool | None = None
    schedule: tuple[model.Schedule, bool] | None = None
    principal: str | None = None
    call: tuple[QualifiedName, tuple[model.CallArgument, ...]] | None = None
    options: dict[str, tuple[Token, str | int]] = field(default_factory=dict)
    reset: tuple[str, ...] = ()
    seen: set[str] = field(default_factory=set)

    def take(self, action: tuple[str, object]) -> bool:
        """Record an action; False when it was already given."""
        key, value = action
        if key in self.seen:
            return False
        self.seen.add(key)
        setattr(self, key, value)
        return True
