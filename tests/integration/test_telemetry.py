"""OpenTelemetry and the latency histograms against a real PostgreSQL running real attempts.

Spans and metrics go to the SDK's in-memory exporter and reader; the OTEL_* environment path is run in a
subprocess with the SDK's console exporters; and a process that does not ask for telemetry is checked to
never import opentelemetry.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry, generate_latest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from radixjobs import documents
from radixjobs.engine import Engine
from radixjobs.latency import LATENCY_BUCKETS_S, Latencies
from radixjobs.observe import Observer
from radixjobs.server import Daemon, DaemonConfig
from radixjobs.server.http import DaemonCollector
from radixjobs.telemetry import Telemetry
from tests.apps import App
from tests.support import document_engine, document_runs

SECRET = "card-4111-1111"  # in error messages: must never reach a span


@dataclass
class Otel:
    spans: InMemorySpanExporter
    reader: InMemoryMetricReader
    telemetry: Telemetry

    def finished(self, name: str, kind: str = "job") -> list[ReadableSpan]:
        """The finished spans ``name``; of attempts, those of ``kind`` (job, or document)."""
        return [s for s in self.spans.get_finished_spans()
                if s.name == name and (s.attributes or {}).get("radixjobs.kind", kind) == kind]

    def histogram(self, name: str) -> list[Any]:
        """The data points of one histogram metric (all of the reader's collection so far)."""
        data = self.reader.get_metrics_data()
        assert data is not None
        return [point for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                if m.name == name for point in m.data.data_points]


@pytest.fixture
def otel() -> Iterator[Otel]:
    spans = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    yield Otel(spans, reader, Telemetry(tracer_provider, meter_provider))
    tracer_provider.shutdown()
    meter_provider.shutdown()


def dbname(dsn: str) -> str:
    return str(conninfo_to_dict(dsn)["dbname"])


def run_with(dsn: str, observer: Observer) -> None:
    async def go() -> None:
        async with Engine(dsn) as engine:
            engine.observer = observer
            await engine.run_due()

    asyncio.run(go())


def assert_redacted(span: ReadableSpan, *secrets: str) -> None:
    texts = [str(v) for v in (span.attributes or {}).values()] + [span.status.description or ""]
    for secret in secrets:
        assert not any(secret in text for text in texts), (secret, texts)


def test_each_attempt_is_a_span_and_a_histogram_sample(app: App, otel: Otel) -> None:
    app.conn.execute("CREATE PROCEDURE app.conflict() LANGUAGE plpgsql AS $$ BEGIN "
                     f"RAISE EXCEPTION '{SECRET}' USING ERRCODE = '40001'; END $$")
    app.conn.execute(sql.SQL("GRANT EXECUTE ON PROCEDURE app.conflict() TO {}").format(
        sql.Identifier(app.principal)))
    ok = app.job("CREATE JOB app.ok SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('t')")
    bad = app.job("CREATE JOB app.bad SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.conflict()")
    superuser = str(app.conn.info.user)
    app.job(f"CREATE JOB app.root SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {superuser} "
                   "CALL app.record('root')")
    observer = Observer(dbname(app.dsn), Latencies(), otel.telemetry)
    run_with(app.dsn, observer)
    app.make_due(bad)
    run_with(app.dsn, observer)  # the retry: attempt 2

    spans = {(s.attributes or {})["radixjobs.job.name"]: s for s in otel.finished("radixjobs.attempt")
             if (s.attributes or {})["radixjobs.attempt"] == 1}
    assert set(spans) == {"app.ok", "app.bad", "app.root"}
    (ok_row,) = app.history(ok)
    attrs = dict(spans["app.ok"].attributes or {})
    assert attrs == {"radixjobs.kind": "job", "radixjobs.job.name": "app.ok", "radixjobs.database": dbname(app.dsn),
                     "radixjobs.principal.category": "ordinary", "radixjobs.idempotency_key": ok_row["idempotency_key"],
                     "radixjobs.attempt": 1, "radixjobs.retry": 0, "radixjobs.outcome": "succeeded",
                     "radixjobs.tick.planned_ns": ok_row["planned_ns"], "radixjobs.resumed": False}
    assert spans["app.ok"].status.status_code is StatusCode.OK
    assert spans["app.root"].attributes["radixjobs.principal.category"] == "superuser"  # type: ignore[index]
    failed = spans["app.bad"]
    assert failed.attributes["radixjobs.outcome"] == "retrying"  # type: ignore[index]
    assert failed.attributes["radixjobs.failure.category"] == "conflict"  # type: ignore[index]
    assert (failed.status.status_code, failed.status.description) == (StatusCode.ERROR, "conflict")
    (retried,) = [s for s in otel.finished("radixjobs.attempt") if (s.attributes or {})["radixjobs.attempt"] == 2]
    assert retried.attributes["radixjobs.retry"] == 1  # type: ignore[index]
    assert retried.attributes["radixjobs.idempotency_key"] == failed.attributes["radixjobs.idempotency_key"]  # type: ignore[index]
    for span in otel.finished("radixjobs.attempt"):
        assert_redacted(span, SECRET, app.principal, superuser)
        assert span.start_time is not None
        assert span.end_time is not None
        assert 0 < span.end_time - span.start_time < 60 * 10**9

    attempts = {p.attributes["outcome"]: p for p in otel.histogram("radixjobs.attempt.duration")}
    assert (attempts["succeeded"].count, attempts["retrying"].count) == (2, 2)
    assert tuple(attempts["succeeded"].explicit_bounds) == LATENCY_BUCKETS_S
    (claims,) = otel.histogram("radixjobs.claim.duration")
    assert claims.count >= 2
    # the Prometheus twins count the same
    assert observer.latencies.attempts["succeeded"].count == 2
    assert observer.latencies.attempts["retrying"].count == 2
    assert observer.latencies.claims.count == claims.count


@pytest.fixture
def tenant(db: str, pg: Any, conn: psycopg.Connection[Any], roles: Any) -> str:
    """A LOGIN role's DSN; public.tel_ok() succeeds, public.tel_bad() raises with a secret."""
    role = roles("tenant")
    conn.execute("CREATE FUNCTION public.tel_ok() RETURNS void LANGUAGE plpgsql AS $$ BEGIN END $$")
    conn.execute("CREATE FUNCTION public.tel_bad() RETURNS void LANGUAGE plpgsql AS "
                 f"$$ BEGIN RAISE EXCEPTION '{SECRET}'; END $$")
    return str(pg.dsn_for(dbname(db), user=role))


def cron_doc(num: int, function: str) -> dict[str, Any]:
    return {"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE",
            "props": {"NUM": num, "DB_FUNCTION": function, "INTERVAL": "now() + interval '1 hour'",
                      "FIRST_RUN": "2025-01-01T00:00:00"}}


async def test_each_document_run_is_a_span(db: str, tenant: str, otel: Otel) -> None:
    with psycopg.connect(tenant, autocommit=True) as c:
        documents.apply(c, [cron_doc(201, "tel_ok"), cron_doc(202, "tel_bad")])
    async with document_engine(db, entry_points=False) as scheduler:
        scheduler.work.observer = Observer(dbname(db), Latencies(), otel.telemetry)
        assert await document_runs(scheduler) == 2
    spans = {(s.attributes or {})["radixjobs.document.num"]: s
             for s in otel.finished("radixjobs.attempt", "document")}
    assert set(spans) == {"201", "202"}
    ok = dict(spans["201"].attributes or {})
    assert ok.pop("radixjobs.document.process_id") > 0
    assert ok == {"radixjobs.kind": "document", "radixjobs.document.num": "201", "radixjobs.document.kind": "db",
                  "radixjobs.database": dbname(db), "radixjobs.principal.category": "ordinary",
                  "radixjobs.rerun": False, "radixjobs.outcome": "completed"}
    bad = spans["202"]
    assert bad.attributes["radixjobs.outcome"] == "failed"  # type: ignore[index]
    assert bad.attributes["radixjobs.failure.category"] == "raised_exception"  # type: ignore[index]
    assert (bad.status.status_code, bad.status.description) == (StatusCode.ERROR, "raised_exception")
    role = str(conninfo_to_dict(tenant)["user"])
    for span in spans.values():
        assert_redacted(span, SECRET, role)


async def test_the_daemon_traces_and_exports_both_histograms(app: App, tenant: str, otel: Otel) -> None:
    app.job("CREATE JOB app.tick SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('d')")
    with psycopg.connect(tenant, autocommit=True) as c:
        documents.apply(c, [cron_doc(301, "tel_ok")])
    daemon = Daemon(DaemonConfig(dsn=app.dsn, poll_s=0.05, discovery_s=0.2, grace_s=1.0), tracing=otel.telemetry)
    task = asyncio.create_task(daemon.run())
    deadline = time.monotonic() + 30
    while not (otel.finished("radixjobs.attempt") and otel.finished("radixjobs.attempt", "document")):
        assert time.monotonic() < deadline, "no attempt and document spans from the daemon"
        assert not task.done(), task
        await asyncio.sleep(0.05)
    daemon.stop()
    await asyncio.wait_for(task, 30)

    (attempt,) = otel.finished("radixjobs.attempt")
    assert attempt.attributes["radixjobs.job.name"] == "app.tick"  # type: ignore[index]
    assert attempt.attributes["radixjobs.database"] == dbname(app.dsn)  # type: ignore[index]
    (run,) = otel.finished("radixjobs.attempt", "document")
    assert run.attributes["radixjobs.document.num"] == "301"  # type: ignore[index]
    registry = CollectorRegistry()
    registry.register(DaemonCollector(daemon))
    text = generate_latest(registry).decode()
    # the job's attempt and the document's run: attempts both
    assert 'radixjobs_attempt_duration_seconds_count{outcome="succeeded"} 2.0' in text
    assert 'radixjobs_attempt_duration_seconds_bucket{le="+Inf",outcome="succeeded"} 2.0' in text
    assert 'radixjobs_attempt_duration_seconds_count{outcome="failed"} 0.0' in text
    claims = daemon.latencies.claims.count
    assert claims >= 1
    assert f"radixjobs_claim_duration_seconds_count {float(claims)}" in text
    (otel_claims,) = otel.histogram("radixjobs.claim.duration")
    assert otel_claims.count == claims
    otel.telemetry.tracer.start_span("still open").end()  # an injected tracer is not shut down by the daemon
    assert otel.finished("still open")


# -- the OTEL_* environment, in a process of its own ----------------------------------------------------

PROBE = """
import asyncio, json, sys
import radixjobs, radixjobs.cli, radixjobs.server.http
from radixjobs.engine import Engine
from radixjobs.observe import Observer
from radixjobs.server import Daemon, DaemonConfig

async def main(dsn):
    daemon = Daemon(DaemonConfig(dsn=dsn))
    async with Engine(dsn) as engine:
        engine.observer = Observer("probe", daemon.latencies, daemon.tracing)
        ran = await engine.run_due()
    if daemon.tracing is not None:
        daemon.tracing.close()
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print("PROBE " + json.dumps({"ran": ran, "tracing": daemon.tracing is not None, "loaded": loaded}))

asyncio.run(main(sys.argv[1]))
"""


def probe(dsn: str, **otel_env: str) -> tuple[dict[str, Any], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")} | otel_env
    done = subprocess.run([sys.executable, "-c", PROBE, dsn], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("PROBE ")]
    return json.loads(line[len("PROBE "):]), done.stdout


@pytest.mark.parametrize("otel_env", [{}, {"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "console"},
                                      {"OTEL_SERVICE_NAME": "named-only"}])
def test_without_otel_asked_for_nothing_imports_opentelemetry(app: App, otel_env: dict[str, str]) -> None:
    app.job("CREATE JOB app.quiet SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('q')")
    result, _ = probe(app.dsn, **otel_env)
    assert result == {"ran": 1, "tracing": False, "loaded": []}


def test_the_otel_environment_picks_the_exporters(app: App) -> None:
    app.job("CREATE JOB app.loud SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {p} CALL app.record('l')")
    result, out = probe(app.dsn, OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="console",
                        OTEL_SERVICE_NAME="radix-e2e")
    assert result["ran"] == 1
    assert result["tracing"]
    assert '"name": "radixjobs.attempt"' in out
    assert '"radixjobs.job.name": "app.loud"' in out
    assert '"service.name": "radix-e2e"' in out
    assert '"name": "radixjobs.attempt.duration"' in out  # the console metric exporter, flushed at close

