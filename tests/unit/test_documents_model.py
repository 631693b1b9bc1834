"""CRON_TABLE documents, pure: validation, the _processTask decision table, finish planning."""

from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from radixjobs.documents.model import (
    Action,
    ProcessState,
    Status,
    document_num,
    document_problems,
    empty_expression_reason,
    parse_function_name,
    plan_finish,
    process_task,
    quote_literal,
    settle,
    validate,
)
from tests.support import SEED

T0 = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)


def doc_with(**props: Any) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    for key, value in props.items():
        if value is ...:
            doc["props"].pop(key, None)
        else:
            doc["props"][key] = value
    return doc


# -- validation ---------------------------------------------------------------------------------------------

def test_seed_example_is_valid() -> None:
    assert validate(SEED) == []
    assert validate([SEED]) == []


def test_csp_document_is_valid() -> None:
    doc = doc_with(DB_FUNCTION=..., CSP_SERVICE="mail.send", CSP_SERVICE_PARAMS='{"to": "ops"}')
    assert validate(doc) == []
    assert validate(doc_with(DB_FUNCTION=..., CSP_SERVICE="x", CSP_SERVICE_PARAMS={"a": [1]})) == []


@pytest.mark.parametrize("status", ["CRON_TABLE_ACTIVE", "CRON_TABLE_PASSIVE", "CRON_TABLE_ERROR",
                                    "CRON_TABLE_DISABLED", "CRON_TABLE_ON_HOLD_2"])
def test_any_cron_table_status_is_valid(status: str) -> None:
    """The seed: any status but ACTIVE disables the task (the database stores the others as PASSIVE)."""
    assert validate({**SEED, "status": status}) == []


@pytest.mark.parametrize("status", ["cron_table_active", "Cron_Table_Disabled", "CRON_TABLE_", "CRON_TABLE",
                                    "CRON_TABLE_DISABLED ", "CRON-TABLE-DISABLED", "CRON_TABLE_É", ""])
def test_a_status_not_of_the_form_cron_table_name_is_refused(status: str) -> None:
    assert [p.split(", not ")[0] for p in validate({**SEED, "status": status})] == [
        "NUM 101: status must be CRON_TABLE_ACTIVE, CRON_TABLE_PASSIVE or CRON_TABLE_ERROR"]


def test_maintained_and_reserved_props_are_accepted() -> None:
    doc = doc_with(NEXT_RUN="2030-01-01", COUNT_ERROR=7, SYS_PROCESS_ID=3, ERROR_TEXT="x",
                   PERIODICAL_RUN={"any": "thing"}, DEL_ON_FINISH=True, RUN_AS="alice")
    assert validate(doc) == []


@pytest.mark.parametrize(("change", "problem"), [
    ({"DB_FUNCTION": ...}, "one of DB_FUNCTION and CSP_SERVICE is required"),
    ({"CSP_SERVICE": "svc"}, "DB_FUNCTION and CSP_SERVICE exclude each other: give exactly one"),
    ({"DB_FUNCTION": "a; drop table x"}, "DB_FUNCTION must be a function name (name or schema.name), "
                                         "not 'a; drop table x'"),
    ({"DB_FUNCTION": "a.b.c"}, "DB_FUNCTION must be a function name"),
    ({"DB_FUNCTION": 5}, "DB_FUNCTION must be a string"),
    ({"CSP_SERVICE_PARAMS": "{}"}, "CSP_SERVICE_PARAMS is only used with CSP_SERVICE"),
    ({"MAX_COUNT_ERROR": -1}, "MAX_COUNT_ERROR must be an integer from 0 to 2147483647"),
    ({"MAX_COUNT_ERROR": 2.5}, "MAX_COUNT_ERROR must be an integer"),
    ({"MAX_COUNT_ERROR": "3"}, "MAX_COUNT_ERROR must be an integer"),
    ({"MAX_COUNT_ERROR": True}, "MAX_COUNT_ERROR must be an integer"),
    ({"FIRST_RUN": "tomorrow"}, "FIRST_RUN must be an ISO-8601 timestamp such as 2025-01-01T00:00:00, "
                                "not 'tomorrow'"),
    ({"FIRST_RUN": "2025-02-30T00:00:00"}, "FIRST_RUN must be an ISO-8601 timestamp"),
    ({"FIRST_RUN": 20250101}, "FIRST_RUN must be an ISO-8601 timestamp"),
    ({"NUM": ...}, "NUM is missing"),
    ({"NUM": 1.5}, "NUM must be an integer or a non-empty string"),
    ({"NUM": True}, "NUM must be an integer or a non-empty string"),
    ({"NUM": "  "}, "NUM must be an integer or a non-empty string"),
    ({"NUM": "x" * 101}, "NUM must be an integer or a non-empty string"),
    ({"DESCR": 1}, "DESCR must be a string"),
    ({"INTERVAL": 3600}, "INTERVAL must be a string (a SQL expression)"),
    ({"INTERVAL_ERROR": ["x"]}, "INTERVAL_ERROR must be a string (a SQL expression)"),
    ({"RUN_AS": ""}, "RUN_AS must be a role name"),
    ({"Interval": "x"}, "unknown property 'Interval' (property names are upper case: INTERVAL)"),
    ({"COLOR": "red"}, "unknown property 'COLOR'"),
    ({"INTERVAL": "NEXT_DAY(NOW(), 'MONDAY') + INTERVAL '9 hours'"},
     "INTERVAL is refused: function next_day() is not allowed"),
])
def test_each_rule_names_its_problem(change: dict[str, Any], problem: str) -> None:
    problems = validate(doc_with(**change))
    assert len(problems) == 1, problems
    assert problem in problems[0]


def test_csp_params_must_be_json() -> None:
    base = {"DB_FUNCTION": ..., "CSP_SERVICE": "svc"}
    assert validate(doc_with(**base, CSP_SERVICE_PARAMS="{not json")) == [
        "NUM 101: CSP_SERVICE_PARAMS is a string but not valid JSON"]
    assert validate(doc_with(**base, CSP_SERVICE_PARAMS="NaN")) == [
        "NUM 101: CSP_SERVICE_PARAMS is a string but not valid JSON"]
    assert validate(doc_with(**base, CSP_SERVICE_PARAMS=5)) == [
        "NUM 101: CSP_SERVICE_PARAMS must be a JSON object or array, or a string holding JSON"]
    assert validate(doc_with(**base, CSP_SERVICE_PARAMS="5")) == []


@pytest.mark.parametrize(("doc", "problem"), [
    ([], "a document must be a JSON object"),
    ({**SEED, "dockind": "INVOICE"}, "dockind must be 'CRON_TABLE', not 'INVOICE'"),
    ({k: v for k, v in SEED.items() if k != "dockind"}, "dockind is missing"),
    ({**SEED, "status": "ACTIVE"}, "status must be CRON_TABLE_ACTIVE, CRON_TABLE_PASSIVE or CRON_TABLE_ERROR, "
                                   "not 'ACTIVE'"),
    ({k: v for k, v in SEED.items() if k != "status"}, "status is missing"),
    ({**SEED, "status": ["CRON_TABLE_ACTIVE"]}, "status must be CRON_TABLE_ACTIVE"),
    ({**SEED, "props": []}, "props must be a JSON object"),
    ({"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE"}, "props is missing"),
    ({**SEED, "owner": "me"}, "unknown key 'owner' (a document has dockind, status and props)"),
])
def test_document_level_problems(doc: Any, problem: str) -> None:
    problems = document_problems(doc)
    assert problems == [problem] or (len(problems) == 1 and problem in problems[0]), problems


def test_every_problem_is_named_at_once() -> None:
    bad = {"dockind": "X", "status": "NOPE", "extra": 1,
           "props": {"NUM": 1.5, "DB_FUNCTION": "a;b", "CSP_SERVICE": "", "MAX_COUNT_ERROR": -1,
                     "FIRST_RUN": "soon", "foo": 1, "INTERVAL": "now()) FROM secrets --"}}
    problems = validate(bad)
    expected = ["unknown key 'extra'", "dockind must be", "status must be", "unknown property 'foo'",
                "NUM must be", "DB_FUNCTION and CSP_SERVICE exclude", "DB_FUNCTION must be a function name",
                "CSP_SERVICE must be a non-empty string", "MAX_COUNT_ERROR must be", "FIRST_RUN must be",
                "INTERVAL is refused: syntax error"]
    assert len(problems) == len(expected), problems
    for fragment, problem in zip(expected, problems, strict=True):
        assert fragment in problem
        assert problem.startswith(fragment)  # no valid NUM: no prefix


def test_list_prefixes_positions_and_finds_duplicate_nums() -> None:
    other = doc_with(NUM="101", DB_FUNCTION="x.y")  # "101" and 101 are the same task
    problems = validate([SEED, doc_with(NUM=7, MAX_COUNT_ERROR=-2), other])
    assert problems == ["document 2 (NUM 7): MAX_COUNT_ERROR must be an integer from 0 to 2147483647",
                        "NUM 101 appears more than once (documents 1, 3)"]


def test_document_num() -> None:
    assert document_num(SEED) == "101"
    assert document_num(doc_with(NUM="A-7")) == "A-7"
    assert document_num(doc_with(NUM=-3)) == "-3"
    assert document_num(doc_with(NUM=False)) is None
    assert document_num({"props": "x"}) is None


@pytest.mark.parametrize(("text", "parts"), [
    ("archive_logs", ("archive_logs",)),
    ("Public.Archive", ("public", "archive")),
    (' app . "Do It" ', ("app", "Do It")),
    ('"a""b"', ('a"b',)),
    ("a$1", ("a$1",)),
    ("é", ("é",)),
    ("1a", None), ("a b", None), ("a.", None), ('""', None), ("a.b.c", None), ("", None),
    ("a;drop", None), ("a()", None), ("x" * 64, None), ('"unterminated', None),
])
def test_parse_function_name_follows_parse_ident(text: str, parts: tuple[str, ...] | None) -> None:
    assert parse_function_name(text) == parts


def test_quote_literal() -> None:
    assert quote_literal("it's") == "'it''s'"
    assert quote_literal("a\\b") == "E'a\\\\b'"


# -- the decision table (one test per case of the seed's _processTask, plus the dead node) ------------------

def test_next_run_in_the_future_skips() -> None:
    running = ProcessState("running", live=True)
    assert process_task(T0, T0 + dt.timedelta(seconds=1), None, None) is Action.SKIP
    assert process_task(T0, T0 + dt.timedelta(hours=1), 5, running) is Action.SKIP


def test_no_process_runs() -> None:
    assert process_task(T0, T0, None, None) is Action.RUN
    assert process_task(T0, None, None, None) is Action.RUN  # never ran, no FIRST_RUN


def test_process_not_found_runs_again() -> None:
    assert process_task(T0, T0, 42, None) is Action.RERUN


def test_failed_process_finishes_with_error() -> None:
    assert process_task(T0, T0, 42, ProcessState("failed", live=False, error_text="boom")) is Action.FINISH_ERROR


def test_completed_process_finishes_ok() -> None:
    assert process_task(T0, T0, 42, ProcessState("completed", live=False)) is Action.FINISH_OK


def test_running_process_is_left_alone() -> None:
    assert process_task(T0, T0, 42, ProcessState("running", live=True)) is Action.WAIT


def test_running_process_on_a_dead_node_runs_again() -> None:
    assert process_task(T0, T0, 42, ProcessState("running", live=False)) is Action.RERUN


# -- finishing ----------------------------------------------------------------------------------------------

PROPS = SEED["props"]


def test_success_resets_the_counter_and_uses_interval() -> None:
    plan = plan_finish(PROPS, 2, None)
    assert (plan.count_error, plan.status, plan.expression_name, plan.error_text) == (0, Status.ACTIVE,
                                                                                       "INTERVAL", None)
    assert plan.expression_text == PROPS["INTERVAL"]


def test_error_counts_and_uses_interval_error() -> None:
    plan = plan_finish(PROPS, 0, "boom")
    assert (plan.count_error, plan.status, plan.expression_name, plan.error_text) == (1, Status.ACTIVE,
                                                                                       "INTERVAL_ERROR", "boom")


def test_error_without_interval_error_uses_interval() -> None:
    plan = plan_finish({**PROPS, "INTERVAL_ERROR": " "}, 0, "boom")
    assert plan.expression_name == "INTERVAL"


def test_third_error_with_max_three_stops_the_task() -> None:
    assert plan_finish(PROPS, 1, "boom").status is Status.ACTIVE
    plan = plan_finish(PROPS, 2, "boom")
    assert (plan.count_error, plan.status, plan.expression_name) == (3, Status.ERROR, None)
    assert "COUNT_ERROR 3 reached MAX_COUNT_ERROR 3" in (plan.error_text or "")
    assert settle(plan, T0, None, None) == settle(plan, T0, T0, None)
    assert settle(plan, T0, None, None).next_run is None


def test_max_count_error_zero_stops_at_the_first_error_and_absent_never() -> None:
    assert plan_finish({**PROPS, "MAX_COUNT_ERROR": 0}, 0, "boom").status is Status.ERROR
    assert plan_finish({**PROPS, "MAX_COUNT_ERROR": 1}, 0, "boom").status is Status.ERROR
    unlimited = {k: v for k, v in PROPS.items() if k != "MAX_COUNT_ERROR"}
    assert plan_finish(unlimited, 10_000, "boom").status is Status.ACTIVE


def test_settle_keeps_active_with_a_later_time() -> None:
    out = settle(plan_finish(PROPS, 0, None), T0, T0 + dt.timedelta(hours=1), None)
    assert (out.status, out.next_run, out.error_text) == (Status.ACTIVE, T0 + dt.timedelta(hours=1), None)


def test_settle_goes_passive_for_null_past_or_a_reason() -> None:
    plan = plan_finish(PROPS, 0, None)
    assert settle(plan, T0, None, None).error_text == "INTERVAL: the value is NULL; the task is now passive"
    past = settle(plan, T0, T0, None)
    assert past.status is Status.PASSIVE
    assert "is not after the run's end" in (past.error_text or "")
    refused = settle(plan_finish(PROPS, 0, "boom"), T0, None, "refused: x")
    assert refused == settle(plan_finish(PROPS, 0, "boom"), T0, None, "refused: x")
    assert refused.error_text == "boom; INTERVAL_ERROR: refused: x; the task is now passive"


def test_empty_interval_runs_once() -> None:
    plan = plan_finish({"NUM": 1, "DB_FUNCTION": "f"}, 0, None)
    reason = empty_expression_reason(plan)
    assert reason is not None
    assert "ran once" in reason
    assert settle(plan, T0, None, reason).status is Status.PASSIVE
    assert empty_expression_reason(plan_finish(PROPS, 0, None)) is None
