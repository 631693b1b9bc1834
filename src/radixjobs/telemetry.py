"""OpenTelemetry for the daemon (the ``otel`` extra): spans of attempts and document runs, latency metrics.

Imported only by radixjobs.observe.load_tracing, when the OTEL_* environment asks for it: nothing else
in radixjobs imports this module or opentelemetry. It never imports radixjobs.observe: the bounds and
outcomes both share are in radixjobs.latency.

- A span ``radixjobs.attempt`` per finalised attempt, from its start to its finalisation (written when it
  ends, with its start and end times): ``radixjobs.kind`` is ``job`` for a job's attempt and ``document``
  for a CRON_TABLE run, which carries the document's attributes in place of the job's. Attributes are
  the job name, the database, the principal's *category* (never its name: docs/security.md), the
  idempotency key, the attempt and retry numbers, the outcome and a failure's category. No error text, no
  argument: a failed span's status says the category only.
- Histograms ``radixjobs.claim.duration`` and ``radixjobs.attempt.duration`` (seconds, outcome attribute),
  the twins of /metrics' radixjobs_claim_duration_seconds and radixjobs_attempt_duration_seconds.
- Configuration is the standard environment, read by the SDK and the exporters themselves
  (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER, OTEL_BSP_*, OTEL_METRIC_EXPORT_INTERVAL,
  OTEL_EXPORTER_OTLP_*); the exporters are chosen here as the SDK's own configurator does, by entry point,
  from OTEL_TRACES_EXPORTER / OTEL_METRICS_EXPORTER (default ``otlp``; ``none`` turns a signal off).
  ``otlp`` is OTLP over HTTP/protobuf (the extra ships it), or gRPC when OTEL_EXPORTER_OTLP_PROTOCOL says
  ``grpc`` (install opentelemetry-exporter-otlp-proto-grpc).
- When the process already has SDK providers (run under ``opentelemetry-instrument``, or a program that
  configured them before using radixjobs), those are used and left to their owner.
- Exporting happens in the SDK's background threads: a collector that is slow or away never holds an
  attempt up.
"""

from __future__ import annotations

import os
import time
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricExporter, MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from radixjobs import retry
from radixjobs.errors import ConfigError
from radixjobs.latency import LATENCY_BUCKETS_S, attempt_outcome

if TYPE_CHECKING:
    from radixjobs.documents.model import Started
    from radixjobs.engine.attempt import Claim
    from radixjobs.engine.definitions import JobDefinition
    from radixjobs.engine.principals import PrincipalPools

SCOPE: Final = "radixjobs"
DEFAULT_SERVICE_NAME: Final = "radixjobs"
OTLP_BY_PROTOCOL: Final = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}


def package_version() -> str:
    try:
        return version("radixjobs")
    except PackageNotFoundError:  # run from a source tree
        return "0"


def principal_category(principals: PrincipalPools, principal: str) -> str:
    """``superuser`` or ``ordinary``, as the principal's session reported at login; ``unknown`` when no
    session of it is open here (its login failed, or it ran a CSP service only)."""
    superuser = principals.is_superuser(principal)
    return "unknown" if superuser is None else "superuser" if superuser else "ordinary"


def _wall_start_ns(began: float) -> tuple[int, int]:
    """(start, end) in Unix nanoseconds of something that began at time.monotonic() ``began`` and ends now."""
    end = time.time_ns()
    return end - int((time.monotonic() - began) * 1e9), end


class Telemetry:
    """Spans and metrics through the given providers; ``close`` shuts down those this object made."""

    def __init__(self, tracer_provider: trace.TracerProvider, meter_provider: metrics.MeterProvider, *,
                 owned: bool = False):
        version = package_version()
        self.tracer = tracer_provider.get_tracer(SCOPE, version)
        meter = meter_provider.get_meter(SCOPE, version)
        self.claim_duration = meter.create_histogram(
            "radixjobs.claim.duration", unit="s", description="Duration of a claim round trip",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S)
        self.attempt_duration = meter.create_histogram(
            "radixjobs.attempt.duration", unit="s", description="Duration of an attempt, start to finalisation",
            explicit_bucket_boundaries_advisory=LATENCY_BUCKETS_S)
        self._owned: tuple[Any, ...] = (tracer_provider, meter_provider) if owned else ()

    def claimed(self, database: str, seconds: float) -> None:
        self.claim_duration.record(seconds)

    def attempt(self, database: str, job: JobDefinition, claim: Claim, result: str, started: float,
                principals: PrincipalPools) -> None:
        start_ns, end_ns = _wall_start_ns(started)
        outcome, _, category = result.partition(":")
        self.attempt_duration.record((end_ns - start_ns) / 1e9, {"outcome": attempt_outcome(result)})
        attributes: dict[str, Any] = {
            "radixjobs.kind": "job", "radixjobs.job.name": job.name, "radixjobs.database": database,
            "radixjobs.principal.category": principal_category(principals, job.principal),
            "radixjobs.idempotency_key": claim.idempotency_key, "radixjobs.attempt": claim.attempt,
            "radixjobs.retry": claim.attempt - 1, "radixjobs.outcome": outcome,
            "radixjobs.tick.planned_ns": claim.planned_ns, "radixjobs.resumed": claim.resumed,
        }
        if category:
            attributes["radixjobs.failure.category"] = category
        span = self.tracer.start_span("radixjobs.attempt", kind=SpanKind.INTERNAL, start_time=start_ns,
                                      attributes=attributes)
        span.set_status(Status(StatusCode.ERROR, category) if category else Status(StatusCode.OK))
        span.end(end_time=end_ns)

    def document_run(self, database: str, num: str, started: Started, error: str | None, began: float,
                     rerun: bool, principals: PrincipalPools) -> None:
        start_ns, end_ns = _wall_start_ns(began)
        self.attempt_duration.record((end_ns - start_ns) / 1e9, {"outcome": "failed" if error else "succeeded"})
        attributes: dict[str, Any] = {
            "radixjobs.kind": "document", "radixjobs.document.num": num, "radixjobs.document.kind": started.kind,
            "radixjobs.document.process_id": started.process_id, "radixjobs.database": database,
            "radixjobs.principal.category": principal_category(principals, started.principal),
            "radixjobs.rerun": rerun, "radixjobs.outcome": "failed" if error else "completed",
        }
        status = Status(StatusCode.OK)
        if error is not None:  # the category of its one-line text, never the text (it may quote an argument)
            category = str(retry.classify_document_error(error).category)
            attributes["radixjobs.failure.category"] = category
            status = Status(StatusCode.ERROR, category)
        span = self.tracer.start_span("radixjobs.attempt", kind=SpanKind.INTERNAL, start_time=start_ns,
                                      attributes=attributes)
        span.set_status(status)
        span.end(end_time=end_ns)

    def close(self) -> None:
        """Flush and stop the providers this object made (the last spans and metrics are exported)."""
        for provider in self._owned:
            provider.shutdown()
        self._owned = ()


def exporter_names(signal: str) -> list[str]:
    """The entry point names OTEL_<SIGNAL>_EXPORTER asks for (default otlp), ``otlp`` resolved by protocol."""
    value = os.environ.get(f"OTEL_{signal.upper()}_EXPORTER", "otlp").strip() or "otlp"
    if value.lower() == "none":
        return []
    protocol = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    names = []
    for name in (part.strip() for part in value.split(",") if part.strip()):
        if name == "otlp":
            if protocol not in OTLP_BY_PROTOCOL:
                raise ConfigError(f"OTEL_EXPORTER_OTLP_PROTOCOL must be http/protobuf or grpc, got {protocol!r}")
            name = OTLP_BY_PROTOCOL[protocol]
        names.append(name)
    return names


def load_exporter(signal: str, name: str) -> Any:
    """The exporter class an entry point of group opentelemetry_<signal>_exporter names; ConfigError if none."""
    group = f"opentelemetry_{signal}_exporter"
    found = entry_points(group=group, name=name)
    if not found:
        installed = ", ".join(sorted(ep.name for ep in entry_points(group=group))) or "none"
        hint = " (pip install opentelemetry-exporter-otlp-proto-grpc)" if name == "otlp_proto_grpc" else ""
        raise ConfigError(f"OTEL_{signal.upper()}_EXPORTER: no {signal} exporter {name!r} is installed{hint}; "
                          f"installed: {installed}")
    return next(iter(found)).load()


def resource() -> Resource:
    """The SDK's resource from the environment, named ``radixjobs`` unless OTEL_SERVICE_NAME (or
    OTEL_RESOURCE_ATTRIBUTES) names the service."""
    detected = Resource.create()
    if str(detected.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        return detected.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return detected


def from_environment() -> Telemetry:
    """Telemetry as the OTEL_* environment configures it; ConfigError (one line) for a value it cannot use
    (checked before anything is started)."""
    current_tracer, current_meter = trace.get_tracer_provider(), metrics.get_meter_provider()
    if isinstance(current_tracer, TracerProvider) and isinstance(current_meter, MeterProvider):
        return Telemetry(current_tracer, current_meter)  # configured by the process already
    span_exporters = [load_exporter("traces", name) for name in exporter_names("traces")]
    metric_exporters = [load_exporter("metrics", name) for name in exporter_names("metrics")]
    for kind, classes, bases in (("TRACES", span_exporters, (SpanExporter,)),
                                 ("METRICS", metric_exporters, (MetricExporter, MetricReader))):
        for cls in classes:
            if not (isinstance(cls, type) and issubclass(cls, bases)):
                raise ConfigError(f"OTEL_{kind}_EXPORTER: {cls!r} is not a {kind.lower()} exporter")
    shared = resource()
    tracer_provider = TracerProvider(resource=shared)
    for cls in span_exporters:
        tracer_provider.add_span_processor(BatchSpanProcessor(cls()))
    readers = [cls() if issubclass(cls, MetricReader) else PeriodicExportingMetricReader(cls())  # pull or push
               for cls in metric_exporters]
    return Telemetry(tracer_provider, MeterProvider(metric_readers=readers, resource=shared), owned=True)
