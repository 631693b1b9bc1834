"""CSP services: Python callables registered with the scheduler, run in a worker process.

A document names a service (CSP_SERVICE); it never carries an import path. The name is looked up in the
scheduler's registry: the entry point group ``radixjobs.services`` of the installed packages, plus an
explicit allow-list ``{name: "module:function"}`` (or ``{name: function}``) from its configuration, which
wins on a clash. Registering a service makes it runnable, not usable: who may use a name is granted in the
database (``radix.grant_service``), checked when a document is applied and again by ``radix.doc_start``
before every run, so the scheduler only ever calls a service for a task whose grant holds. An unregistered
name fails the run with a one-line error that never lists the registered names.

Each call runs in its own process (multiprocessing, spawn context) with a timeout, so a service that
raises, crashes the interpreter (``os._exit``, a segfault) or hangs only fails its own run: the worker is
killed and the scheduler goes on. The service is called as ``function(params)`` with the parsed
CSP_SERVICE_PARAMS (None when absent); a coroutine function is run to completion with asyncio.run.

A worker never outlives its scheduler, even one killed with ``kill -9``: on Linux it asks for SIGKILL when its
parent dies (``PR_SET_PDEATHSIG``, checked against the parent's pid for a parent that died before that), and
everywhere a watchdog thread reads a pipe that only the scheduler holds open: end of file (the scheduler is
gone) kills the worker's process group. The worker leads a process group of its own, and the scheduler ends
a call that timed out or was cancelled by killing that group, so processes the service started go with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import importlib
import importlib.metadata
import inspect
import multiprocessing
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any, Final

ENTRY_POINT_GROUP: Final = "radixjobs.services"
MAX_ERROR_CHARS: Final = 2000
_DOTTED: Final = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
_SPEC: Final = re.compile(f"{_DOTTED}:{_DOTTED}")
PR_SET_PDEATHSIG: Final = 1  # linux/prctl.h

ServiceSpec = str | Callable[..., Any]


def spec_of(service: ServiceSpec) -> str:
    """``module:function`` of a service given as that text or as a module-level function."""
    if isinstance(service, str):
        spec = service.strip()
    else:
        qualname = getattr(service, "__qualname__", "")
        if "<" in qualname or not getattr(service, "__module__", None):
            raise ValueError(f"a CSP service must be a module-level function, not {service!r}")
        spec = f"{service.__module__}:{qualname}"
    if not _SPEC.fullmatch(spec):
        raise ValueError(f"a CSP service must be given as 'module:function', not {spec!r}")
    return spec


class ServiceRegistry:
    """The services this scheduler may run, by name."""

    def __init__(self, services: Mapping[str, ServiceSpec] | None = None, *, entry_points: bool = True):
        self._specs: dict[str, str] = {}
        if entry_points:
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
                self._specs[ep.name] = ep.value
        for name, service in (services or {}).items():
            self._specs[name] = spec_of(service)

    def names(self) -> list[str]:
        return sorted(self._specs)

    def spec(self, name: str) -> str | None:
        """The registered ``module:function`` of ``name``, or None."""
        return self._specs.get(name)


@dataclass(frozen=True)
class ServiceOutcome:
    """How a service call ended; ``error`` is one line, None on success."""

    ok: bool
    error: str | None = None


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_ERROR_CHARS else text[: MAX_ERROR_CHARS - 1] + "…"


def _load(spec: str) -> Callable[..., Any]:
    module_name, _, attribute = spec.partition(":")
    target: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec} is not callable")
    return target  # type: ignore[no-any-return]


def _die_with_parent(parent_pid: int, lifeline: Connection) -> None:
    """Make this worker end when the scheduler process ends, however it ends."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)  # a group of its own: the scheduler (or the watchdog) kills the whole group
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the scheduler died before the request above took effect
        os._exit(1)

    def watchdog() -> None:
        with contextlib.suppress(EOFError, OSError):
            while True:
                lifeline.recv_bytes()  # the scheduler never writes: this returns only at end of file
        with contextlib.suppress(OSError):
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watchdog, name="radixjobs-lifeline", daemon=True).start()


def _worker(spec: str, params: Any, reply: Connection, parent_pid: int, lifeline: Connection) -> None:
    """Entry point of the worker process: tied to its scheduler's life, then the call."""
    _die_with_parent(parent_pid, lifeline)
    _serve_call(spec, params, reply)


def _serve_call(spec: str, params: Any, reply: Connection) -> None:
    """Call the service, send ("ok", None) or ("error", text); a scheduler no longer listening is no error."""
    try:
        result = _load(spec)(params)
        if inspect.isawaitable(result):
            async def wait() -> Any:
                return await result

            asyncio.run(wait())
        outcome: tuple[str, str | None] = ("ok", None)
    except BaseException as exc:  # the worker reports everything, SystemExit included
        outcome = ("error", _short(f"{type(exc).__name__}: {exc}"))
    with contextlib.suppress(OSError):  # the scheduler stopped listening (timeout, cancel): nothing to say
        reply.send(outcome)
    with contextlib.suppress(OSError):
        reply.close()


def call_blocking(name: str, spec: str, params: Any, *, timeout_s: float,
                  cancel: threading.Event | None = None) -> ServiceOutcome:
    """Run one call in a fresh spawned process and wait for it (blocking: run it in a thread)."""
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    lifeline_read, lifeline_write = ctx.Pipe(duplex=False)  # the write end stays here, unused, until the end
    process = ctx.Process(target=_worker, args=(spec, params, sender, os.getpid(), lifeline_read), daemon=True,
                          name=f"radixjobs-csp-{name}")
    process.start()
    sender.close()
    lifeline_read.close()
    deadline = time.monotonic() + timeout_s
    try:
        while not receiver.poll(0.05):
            cancelled = cancel is not None and cancel.is_set()
            if cancelled or time.monotonic() >= deadline:
                # decided once: the worker is killed first, so a result that arrived before the kill is
                # the outcome (its effect happened), and none can arrive after the verdict
                _kill(process)
                reply = _receive(receiver)
                if reply is not None:
                    return _outcome(name, reply)
                if cancelled:
                    return ServiceOutcome(False, f"CSP service {name!r} was cancelled (scheduler shutting down)")
                return ServiceOutcome(False, f"CSP service {name!r} timed out after {timeout_s:g} s: worker killed")
        reply = _receive(receiver)
        if reply is None:
            process.join(5)
            return ServiceOutcome(False, f"CSP service {name!r}: the worker process exited with code "
                                         f"{process.exitcode} without a result")
        return _outcome(name, reply)
    finally:
        receiver.close()
        if process.is_alive():
            process.join(0.5)
        _kill(process)
        lifeline_write.close()
        process.close()


def _receive(receiver: Connection) -> tuple[str, str | None] | None:
    """The worker's reply if one was sent, else None (it died or was killed first)."""
    try:
        if receiver.poll(0):
            status, text = receiver.recv()
            return str(status), text
    except (EOFError, OSError):
        pass
    return None


def _outcome(name: str, reply: tuple[str, str | None]) -> ServiceOutcome:
    status, text = reply
    return ServiceOutcome(True) if status == "ok" else ServiceOutcome(False, f"CSP service {name!r}: {text}")


def _kill(process: BaseProcess) -> None:
    """SIGKILL the worker and what it started (its process group) if it still runs, and reap it."""
    if process.is_alive():
        _kill_group(process)
    process.join(5)


def _kill_group(process: BaseProcess) -> None:
    """Kill a worker and what it started (its process group; the worker itself if it has none yet)."""
    pid = process.pid
    if pid is not None:
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
    process.kill()


async def call(registry: ServiceRegistry, name: str, params: Any, *, timeout_s: float,
               cancel: threading.Event | None = None) -> ServiceOutcome:
    """Run service ``name`` with ``params``; never raises for the service's own failures."""
    spec = registry.spec(name)
    if spec is None:  # never list the registered names: the text is recorded in the document
        return ServiceOutcome(False, f"CSP service {name!r} is not registered with this scheduler")
    return await asyncio.to_thread(call_blocking, name, spec, params, timeout_s=timeout_s, cancel=cancel)
