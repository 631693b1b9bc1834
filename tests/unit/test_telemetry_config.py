"""The OTEL_* environment → exporters, the latency histogram, and the missing-extra path (no database)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from typing import Any

import pytest

from radixjobs import observe, telemetry
from radixjobs.errors import ConfigError
from radixjobs.latency import Histogram
from radixjobs.observe import otel_requested


@pytest.fixture(autouse=True)
def clean_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(("env", "asked"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x"}, False),  # naming the service alone exports nothing
    ({"OTEL_TRACES_EXPORTER": "console"}, True),
    ({"OTEL_METRICS_EXPORTER": "otlp"}, True),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "TRUE"}, False),
    ({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"}, True),
    ({"OTEL_TRACES_EXPORTER": " "}, False),
])
def test_what_asks_for_telemetry(env: dict[str, str], asked: bool) -> None:
    assert otel_requested(env) is asked


def test_exporter_names_follow_the_sdk_conventions(monkeypatch: pytest.MonkeyPatch) -> None:
    assert telemetry.exporter_names("traces") == ["otlp_proto_http"]  # the spec's default, over HTTP
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console, otlp")
    assert telemetry.exporter_names("traces") == ["console", "otlp_proto_http"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    assert telemetry.exporter_names("traces") == ["console", "otlp_proto_grpc"]
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")  # per signal wins
    assert telemetry.exporter_names("traces") == ["console", "otlp_proto_http"]
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert telemetry.exporter_names("metrics") == []
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    with pytest.raises(ConfigError, match="OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf or grpc"):
        telemetry.exporter_names("metrics")


def test_exporters_are_found_by_entry_point() -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

    assert telemetry.load_exporter("traces", "otlp_proto_http") is OTLPSpanExporter
    assert telemetry.load_exporter("metrics", "console") is ConsoleMetricExporter
    with pytest.raises(ConfigError) as missing:
        telemetry.load_exporter("traces", "otlp_proto_grpc")
    assert str(missing.value) == ("OTEL_TRACES_EXPORTER: no traces exporter 'otlp_proto_grpc' is installed (pip "
                                  "install opentelemetry-exporter-otlp-proto-grpc); installed: console, "
                                  "otlp_proto_http")


def test_the_service_is_named_radixjobs_unless_the_environment_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    assert telemetry.resource().attributes["service.name"] == "radixjobs"
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "service.name=from-attributes,team=ops")
    assert telemetry.resource().attributes["service.name"] == "from-attributes"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "scheduler-eu")
    assert telemetry.resource().attributes["service.name"] == "scheduler-eu"
    assert telemetry.resource().attributes["team"] == "ops"


def test_a_bad_exporter_is_a_one_line_error_of_serve() -> None:
    """Before anything is started: the daemon is not built (PostgreSQL down at start is no error here)."""
    env = {"OTEL_TRACES_EXPORTER": "nope", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "radixjobs", "serve", "--dsn",
                           "host=127.0.0.1 port=1 dbname=x connect_timeout=2", "--http", "off"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "radixjobs: error: OTEL_TRACES_EXPORTER: no traces exporter 'nope' is installed; installed: console, "
        "otlp_proto_http")
    assert "Traceback" not in done.stderr


def test_without_the_extra_a_request_is_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "radixjobs.telemetry")
    with caplog.at_level(logging.WARNING, "radixjobs.telemetry"):
        assert observe.load_tracing() is None
    assert "pip install 'radixjobs[otel]'" in caplog.text


def test_histogram_buckets_are_upper_bounds_inclusive() -> None:
    histogram = Histogram((0.1, 1.0))
    for value in (0.05, 0.1, 0.5, 1.0, 7.0):
        histogram.observe(value)
    assert histogram.cumulative() == [(0.1, 2), (1.0, 4), (float("inf"), 5)]
    assert (histogram.count, histogram.sum) == (5, pytest.approx(8.65))


class Broken:
    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> None:
            raise RuntimeError("exporter exploded")
        return fail


def test_broken_telemetry_never_fails_the_work(caplog: pytest.LogCaptureFixture) -> None:
    import time

    observer = observe.Observer("db", tracing=Broken())  # type: ignore[arg-type]
    with caplog.at_level(logging.DEBUG, "radixjobs.telemetry"):
        observer.claimed(0.01)
        observer.attempt(None, None, "failed:data", time.monotonic(), None)  # type: ignore[arg-type]
        observer.document_run("1", None, None, time.monotonic(), False, None)  # type: ignore[arg-type]
    assert observer.latencies.claims.count == 1
    assert observer.latencies.attempts["failed"].count == 1
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) <= 1  # once per process (another test may have been first)
    assert sum("telemetry failed error=RuntimeError" in r.getMessage() for r in caplog.records) == 3
