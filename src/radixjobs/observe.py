"""What the engine reports about its work (its jobs' attempts and its documents' runs), besides its counters.

- Latency histograms (radixjobs.latency, exported by /metrics: server/http.py): the claim round trip, and
  an attempt (a job's, or a document's run) from its start to its finalisation, by outcome (succeeded /
  retrying / failed).
- OpenTelemetry (radixjobs.telemetry, the ``otel`` extra): a span per attempt (``radixjobs.kind`` job or
  document), and the same two histograms as OTel metrics, when the standard ``OTEL_*`` environment asks for
  an exporter.

Invariants:
- the engine and the documents never import this module: each declares the hooks it calls
  (radixjobs.engine.observer, radixjobs.documents.observer) and ``Observer`` here has them all; this module
  reads their types, never the other way round;
- nothing here imports opentelemetry; radixjobs.telemetry is imported only when ``otel_requested`` is true
  (OTEL_SDK_DISABLED is not true, and an exporter or an OTLP endpoint is named), so a process that does not
  ask for it never loads the OpenTelemetry packages, installed or not;
- an Engine or its Documents without an observer (``observer is None``, the default) pays one attribute
  check per hook; the daemon always gives them one (for the histograms);
- what is reported names no principal (its category only), carries no error text and no argument: the
  rules of /status and the logs (docs/security.md).
"""

from __future__ import annotations

import importlib
import logging
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, Protocol

from radixjobs.latency import Latencies, attempt_outcome

if TYPE_CHECKING:
    from radixjobs.documents.model import Started
    from radixjobs.engine.attempt import Claim
    from radixjobs.engine.definitions import JobDefinition
    from radixjobs.engine.principals import PrincipalPools

log = logging.getLogger("radixjobs.telemetry")

# Any of these set (and OTEL_SDK_DISABLED not true) turns OpenTelemetry on; an endpoint alone means the
# spec's default exporter, otlp.
OTEL_REQUEST_VARIABLES: Final = ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
                                 "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")


class Tracing(Protocol):
    """What radixjobs.telemetry.Telemetry offers (typed here so that nothing imports it to type-check)."""

    def claimed(self, database: str, seconds: float) -> None: ...

    def attempt(self, database: str, job: JobDefinition, claim: Claim, result: str, started: float,
                principals: PrincipalPools) -> None: ...

    def document_run(self, database: str, num: str, started: Started, error: str | None, began: float,
                     rerun: bool, principals: PrincipalPools) -> None: ...

    def close(self) -> None: ...


class Observer:
    """The hooks of one database's engine and its documents: histograms, and spans when tracing."""

    def __init__(self, database: str, latencies: Latencies | None = None, tracing: Tracing | None = None):
        self.database = database
        self.latencies = latencies or Latencies()
        self.tracing = tracing

    def claimed(self, seconds: float) -> None:
        """A claim round trip took ``seconds``."""
        self.latencies.claims.observe(seconds)
        if self.tracing is not None:
            try:
                self.tracing.claimed(self.database, seconds)
            except Exception as exc:
                _tracing_failed(exc)

    def attempt(self, job: JobDefinition, claim: Claim, result: str, started: float,
                principals: PrincipalPools) -> None:
        """An attempt was finalised with ``result``; ``started`` is its time.monotonic() at the start."""
        histogram = self.latencies.attempts.get(attempt_outcome(result))
        if histogram is not None:
            histogram.observe(time.monotonic() - started)
        if self.tracing is not None:
            try:
                self.tracing.attempt(self.database, job, claim, result, started, principals)
            except Exception as exc:
                _tracing_failed(exc)

    def document_run(self, num: str, started: Started, error: str | None, began: float, rerun: bool,
                     principals: PrincipalPools) -> None:
        """A CRON_TABLE run ended (``error`` None: completed); ``began`` is its time.monotonic() start."""
        self.latencies.attempts["failed" if error else "succeeded"].observe(time.monotonic() - began)
        if self.tracing is not None:
            try:
                self.tracing.document_run(self.database, num, started, error, began, rerun, principals)
            except Exception as exc:
                _tracing_failed(exc)


_failures = 0


def _tracing_failed(exc: Exception) -> None:
    """Telemetry never fails an attempt or a run: the first failure is logged with its traceback, the
    others only counted in the log's debug level (a broken exporter must not flood the log)."""
    global _failures
    _failures += 1
    if _failures == 1:
        log.warning("telemetry failed error=%s; further failures are logged at debug level", type(exc).__name__,
                    exc_info=exc)
    else:
        log.debug("telemetry failed error=%s failures=%d", type(exc).__name__, _failures)


def otel_requested(environ: Mapping[str, str] | None = None) -> bool:
    """Does the standard OTEL_* environment ask for telemetry? (No import of opentelemetry.)"""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    return any(env.get(name, "").strip() for name in OTEL_REQUEST_VARIABLES)


def load_tracing() -> Tracing | None:
    """OpenTelemetry configured from the environment, or None when it does not ask for it. When it asks
    but the ``otel`` extra is missing: a warning, and None. A bad OTEL_* value raises ConfigError."""
    if not otel_requested():
        return None
    try:
        telemetry = importlib.import_module("radixjobs.telemetry")
    except ImportError as exc:
        log.warning("OTEL_* is set but OpenTelemetry is not installed (%s): no spans or OTel metrics; "
                    "pip install 'radixjobs[otel]'", exc)
        return None
    tracing: Tracing = telemetry.from_environment()
    return tracing
