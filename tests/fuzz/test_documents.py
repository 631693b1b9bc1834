"""CRON_TABLE document validation and the pure decision code, on random and mutated documents.

validate() must never raise, must name a problem for every document it refuses, and must accept only
documents that satisfy every rule of docs/documents.md; the decision table and finish planning must
handle any state. (Against PostgreSQL — the same problems named by radix.document_problems, nothing written
when refused — see test_documents_db.py.)
"""

from __future__ import annotations

import datetime as dt
import json
import re
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from radixjobs.documents import expression
from radixjobs.documents.model import (
    KNOWN_PROPS,
    MAINTAINED_PROPS,
    Action,
    ProcessState,
    Status,
    document_num,
    parse_function_name,
    plan_finish,
    process_task,
    validate,
)
from tests.fuzz import fuzz_settings

SEEDS: list[dict[str, Any]] = [
    {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {
        "NUM": 101, "DESCR": "Hourly log archiving", "DB_FUNCTION": "archive_logs",
        "INTERVAL": "NOW() + INTERVAL '1 hour'", "INTERVAL_ERROR": "NOW() + INTERVAL '5 minutes'",
        "MAX_COUNT_ERROR": 3, "FIRST_RUN": "2025-01-01T00:00:00"}},
    {"dockind": "CRON_TABLE", "status": "CRON_TABLE_PASSIVE", "props": {
        "NUM": "report-7", "CSP_SERVICE": "send_report", "CSP_SERVICE_PARAMS": {"to": ["a@b"], "n": 1},
        "RUN_AS": "reporter", "PERIODICAL_RUN": True, "COUNT_ERROR": 2, "NEXT_RUN": "2025-01-01"}},
    {"dockind": "CRON_TABLE", "status": "CRON_TABLE_DISABLED", "props": {"NUM": 7, "DB_FUNCTION": "app.f"}},
]
IDENTIFIERS = ["archive_logs", "app.f", '"Quoted"."F"', "a.b.c", "a;b", "", " ", '"', "x" * 64, "é.ü", "1x"]
TEXTS = ["", " ", "x", "NOW()", "now() + interval '1 day'", "2025-01-01T00:00:00", "2025-02-30",
         "2025-01-01T00:00:00+03:00", "{", "[]", '{"a": 1}', "os:system", "a\nb", "'", "\x00", "é" * 101]

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70),
                         st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(TEXTS),
                         st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=8), inner, max_size=3)), max_leaves=8)
prop_names = st.one_of(st.sampled_from(sorted(KNOWN_PROPS)), st.sampled_from(["num", "Interval", "extra", ""]),
                       st.text(max_size=10))


@st.composite
def mutated_documents(draw: st.DrawFn) -> Any:
    doc = json.loads(json.dumps(draw(st.sampled_from(SEEDS))))
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["set", "delete", "identifier", "text", "top", "swap_target"]))
        props = doc.get("props") if isinstance(doc, dict) else None
        if operation == "top" and isinstance(doc, dict):
            doc[draw(st.sampled_from(["dockind", "status", "props", "extra"]))] = draw(json_values)
        elif not isinstance(props, dict):
            continue
        elif operation == "set":
            props[draw(prop_names)] = draw(json_values)
        elif operation == "delete" and props:
            props.pop(draw(st.sampled_from(sorted(props))))
        elif operation == "identifier":
            props[draw(st.sampled_from(["DB_FUNCTION", "CSP_SERVICE", "RUN_AS"]))] = draw(st.sampled_from(IDENTIFIERS))
        elif operation == "text":
            props[draw(st.sampled_from(sorted(KNOWN_PROPS)))] = draw(st.sampled_from(TEXTS))
        elif operation == "swap_target":
            props["DB_FUNCTION"], props["CSP_SERVICE"] = props.get("CSP_SERVICE"), props.get("DB_FUNCTION")
    return doc


def _assert_valid(doc: Any) -> None:
    """What validate() promised by returning no problem for ``doc``."""
    assert isinstance(doc, dict)
    assert set(doc) <= {"dockind", "status", "props"}
    assert doc["dockind"] == "CRON_TABLE"
    assert re.fullmatch(r"CRON_TABLE_[A-Z0-9_]+", doc["status"])  # ACTIVE, or a status that disables it
    props = doc["props"]
    assert isinstance(props, dict)
    assert set(props) <= KNOWN_PROPS
    assert document_num(doc) is not None
    targets = [k for k in ("DB_FUNCTION", "CSP_SERVICE") if props.get(k) is not None]
    assert len(targets) == 1
    if targets == ["DB_FUNCTION"]:
        assert parse_function_name(props["DB_FUNCTION"]) is not None
        assert props.get("CSP_SERVICE_PARAMS") is None
    for key in ("INTERVAL", "INTERVAL_ERROR"):
        if isinstance(props.get(key), str) and props[key].strip():
            expression.check(props[key])
    if props.get("FIRST_RUN") is not None:
        dt.datetime.fromisoformat(props["FIRST_RUN"])


def validated(docs: Any) -> list[str]:
    problems = validate(docs)
    assert isinstance(problems, list)
    assert all(isinstance(p, str) and p for p in problems)
    if not problems:
        for doc in docs if isinstance(docs, list) else [docs]:
            _assert_valid(doc)
    return problems


@fuzz_settings()
@given(json_values)
def test_any_json_value(value: Any) -> None:
    validated(value)


@fuzz_settings()
@given(st.fixed_dictionaries({}, optional={"dockind": json_values, "status": json_values,
                                           "props": st.dictionaries(prop_names, json_values, max_size=8)}))
def test_random_documents(doc: dict[str, Any]) -> None:
    validated(doc)


@fuzz_settings()
@given(mutated_documents())
def test_mutated_documents(doc: Any) -> None:
    validated(doc)


@fuzz_settings()
@given(st.lists(mutated_documents(), max_size=4))
def test_lists_name_every_duplicate(docs: list[Any]) -> None:
    problems = validated(docs)
    nums = [document_num(d) for d in docs]
    for num in {n for n in nums if n is not None and nums.count(n) > 1}:
        assert any(p.startswith(f"NUM {num} appears more than once") for p in problems)


moments = st.datetimes(min_value=dt.datetime(2000, 1, 1), max_value=dt.datetime(2100, 1, 1),
                       timezones=st.just(dt.UTC))


@fuzz_settings()
@given(moments, st.none() | moments, st.none() | st.integers(1, 2**40),
       st.none() | st.builds(ProcessState, st.sampled_from(["running", "completed", "failed", "odd"]), st.booleans()))
def test_decision_table_is_total(now: dt.datetime, due: dt.datetime | None, process_id: int | None,
                                 process: ProcessState | None) -> None:
    action = process_task(now, due, process_id, process)
    assert isinstance(action, Action)
    if due is not None and due > now:
        assert action is Action.SKIP
    elif action is Action.WAIT:
        assert process is not None
        assert process.live
        assert process.status not in ("completed", "failed")


@fuzz_settings()
@given(st.dictionaries(st.sampled_from(["INTERVAL", "INTERVAL_ERROR", "MAX_COUNT_ERROR", *MAINTAINED_PROPS]),
                       json_values, max_size=4),
       st.integers(0, 2**31 - 2), st.none() | st.text(max_size=30))
def test_finish_planning_counts_errors(props: dict[str, Any], count_error: int, error: str | None) -> None:
    if not isinstance(props.get("MAX_COUNT_ERROR"), int | None) or isinstance(props.get("MAX_COUNT_ERROR"), bool):
        props.pop("MAX_COUNT_ERROR")  # validated documents only: MAX_COUNT_ERROR is an integer
    for key in ("INTERVAL", "INTERVAL_ERROR"):
        if not isinstance(props.get(key), str | None):
            props.pop(key)
    plan = plan_finish(props, count_error, error)
    assert plan.count_error == (0 if error is None else count_error + 1)
    limit = props.get("MAX_COUNT_ERROR")
    stops = error is not None and limit is not None and plan.count_error >= limit
    assert (plan.status is Status.ERROR) == stops
