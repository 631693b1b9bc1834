"""The chaos run's daemons and its fault driver.

Nodes are ``radixjobs serve`` subprocesses (``--http 127.0.0.1:0``, JSON logs, a stable ``--node-id``).
At random moments (a seeded RNG) the driver SIGKILLs a node and restarts it a little later with the same
node id, fast-restarts PostgreSQL, or terminates attempt backends (``application_name =
'radixjobs-attempt'``); it also re-creates the one-time jobs that have completed. The last part of the run
is quiet (every node up, no faults), so every killed claim can be resumed before the clean stop.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from radixjobs import catalog
from radixjobs.errors import RadixError

sys.path.insert(0, str(Path(__file__).resolve().parent))

from chaos_setup import World, create_at_job

DEFAULT_WEIGHTS = {"kill": 4.0, "restart_postgres": 1.0, "terminate_backends": 4.0, "run_job": 3.0}


def now_utc() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Node:
    """One ``radixjobs serve`` process; restarted with the same node id after a kill."""

    def __init__(self, name: str, dsn: str, logdir: Path, grace_s: float):
        self.name = name
        self.dsn = dsn
        self.logdir = logdir
        self.grace_s = grace_s
        self.incarnation = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.incarnation += 1
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "RADIXJOBS_DSN"}
        log = self.logdir / f"{self.name}.{self.incarnation}.log"
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "radixjobs", "serve", "--dsn", self.dsn, "--http", "127.0.0.1:0",
                 "--node-id", self.name, "--log-format", "json", "--grace", str(self.grace_s), "--poll", "0.5"],
                stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def stop(self, timeout_s: float) -> int | None:
        """SIGTERM and wait; the exit code, or None when it had to be killed."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def logs(self) -> list[Path]:
        """The log files of every incarnation, oldest first."""
        return [self.logdir / f"{self.name}.{i}.log" for i in range(1, self.incarnation + 1)]


@dataclass
class Faults:
    """What the driver did, and what went wrong that it did not do on purpose."""

    kills: list[dict[str, Any]] = field(default_factory=list)   # node, at (UTC), held (job ids)
    daemon_restarts: int = 0
    postgres_restarts: int = 0
    postgres_restart_times: list[dt.datetime] = field(default_factory=list)
    terminated_backends: int = 0
    termination_rounds: int = 0
    at_recreations: int = 0
    unexpected_exits: list[str] = field(default_factory=list)
    start_failures_postgres_down: int = 0
    driver_errors: list[str] = field(default_factory=list)
    requested_runs: list[str] = field(default_factory=list)  # idempotency keys of RUN JOB requests


class Driver:
    """Runs the faults for ``seconds`` (the last ``quiet_s`` without faults), seeded by ``rng``."""

    def __init__(self, world: World, nodes: list[Node], rng: random.Random, *, mean_gap_s: float = 4.0,
                 weights: dict[str, float] | None = None):
        self.world = world
        self.weights = weights or DEFAULT_WEIGHTS
        self.nodes = nodes
        self.rng = rng
        self.mean_gap_s = mean_gap_s
        self.faults = Faults()
        self._restarts: list[tuple[float, Node]] = []

    def run(self, seconds: float, quiet_s: float) -> Faults:
        start = time.monotonic()
        end, quiet_from = start + seconds, start + max(0.0, seconds - quiet_s)
        next_fault = start + self._gap()
        next_at = start + 3.0
        while (now := time.monotonic()) < end:
            self._restart_due(now if now < quiet_from else float("inf"))
            self._notice_exits()
            if now >= next_fault and now < quiet_from:
                self._fault()
                next_fault = time.monotonic() + self._gap()
            if now >= next_at:
                self._recreate_at_jobs()
                next_at = time.monotonic() + 4.0
            time.sleep(0.1)
        return self.faults

    def _gap(self) -> float:
        return self.rng.uniform(0.3, 1.7) * self.mean_gap_s

    def _fault(self) -> None:
        kinds = list(self.weights)
        choice = self.rng.choices(kinds, weights=[self.weights[k] for k in kinds])[0]
        try:
            if choice == "kill":
                self._kill()
            elif choice == "restart_postgres":
                self._restart_postgres()
            elif choice == "run_job":
                self._run_job()
            else:
                self._terminate_backends()
        except (psycopg.Error, OSError, RuntimeError, RadixError) as exc:
            self.faults.driver_errors.append(f"{choice}: {type(exc).__name__}: {str(exc).strip()[:200]}")

    def _kill(self) -> None:
        alive = [n for n in self.nodes if n.alive]
        if not alive:
            return
        node = self.rng.choice(alive)
        node.kill()
        killed_at = now_utc()
        held: list[str] | None = None
        with contextlib.suppress(psycopg.Error), self.world.connect() as conn:
            held = [str(r[0]) for r in conn.execute(
                "SELECT job_id FROM radix.radix_system_job_state WHERE lease_node = %s AND status = 'running'",
                (node.name,))]
        self.faults.kills.append({"node": node.name, "at": killed_at, "held": held})
        self._restarts.append((time.monotonic() + self.rng.uniform(0.5, 3.0), node))

    def _restart_due(self, now: float) -> None:
        """Restart killed nodes whose delay has passed (all of them once the quiet part begins)."""
        for item in list(self._restarts):
            when, node = item
            if when <= now or now == float("inf"):
                self._restarts.remove(item)
                node.start()
                self.faults.daemon_restarts += 1

    def _notice_exits(self) -> None:
        pending = {node.name for _, node in self._restarts}
        for node in self.nodes:
            if not node.alive and node.name not in pending:
                code = node.proc.returncode if node.proc else None
                last = (node.logs()[-1].read_text(errors="replace").strip().splitlines()[-1:] or [""])[0]
                if "cannot connect to PostgreSQL" in last:
                    # `serve` refuses to start while PostgreSQL is away (here: restarting); a supervisor
                    # starts it again, as this driver does
                    self.faults.start_failures_postgres_down += 1
                else:
                    self.faults.unexpected_exits.append(
                        f"{node.name} (incarnation {node.incarnation}) exited {code}: {last[:300]}")
                node.start()

    def _run_job(self) -> None:
        """RUN JOB on one to three recurring jobs (the request waits for a running attempt, survives kills and
        restarts, and must run exactly once: chaos_check.check_requested_runs)."""
        names = sorted(self.world.every_ns)
        with self.world.connect() as conn:
            for name in self.rng.sample(names, min(len(names), self.rng.randint(1, 3))):
                self.faults.requested_runs.append(catalog.run_job(conn, name))

    def _restart_postgres(self) -> None:
        self.world.server.restart()
        self.faults.postgres_restarts += 1
        self.faults.postgres_restart_times.append(now_utc())

    def _terminate_backends(self) -> None:
        with self.world.connect() as conn:
            pids = [r[0] for r in conn.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'radixjobs-attempt' AND state = 'active'")]
            chosen = [pid for pid in pids if self.rng.random() < 0.5]
            for pid in chosen:
                row = conn.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()
                self.faults.terminated_backends += int(bool(row and row[0]))
        self.faults.termination_rounds += 1

    def _recreate_at_jobs(self) -> None:
        """Drop one-time jobs that are done and create them again, due in the past or a few seconds ahead."""
        try:
            with self.world.connect() as conn:
                done = conn.execute(
                    "SELECT name, status FROM radix.job_overview WHERE name = ANY (%s) "
                    "AND status IN ('complete', 'failed')", (list(self.world.at_jobs),)).fetchall()
                for name, status in done:
                    catalog.execute_job_ddl(conn, f"DROP JOB {name}")
                    latest = [i for i in self.world.at_incarnations if i["name"] == name][-1]
                    latest["final_status"] = status
                    create_at_job(self.world, conn, name, self.rng.uniform(-30, 8))
                    self.faults.at_recreations += 1
        except (psycopg.Error, RadixError) as exc:
            self.faults.driver_errors.append(f"recreate AT jobs: {type(exc).__name__}: {str(exc).strip()[:200]}")
