"""The other schedulers of ``bench/run.py compare``, each run in its own subprocess so its CPU is its own.

A peer is a script ``bench/peers/NAME_peer.py`` taking the arguments of ``peer_arguments``. It talks to
the scenario over stdin/stdout, one word a line:

1. it sets up (schema, job store, jobs due at once for ``burst``) and prints ``ready``;
2. on ``go`` it starts its scheduler (the scenario resets its CPU meter just before sending it);
3. on ``stop`` (or end of input) it stops its scheduler, closes its connections and prints ``stopped``.

The job bodies make one row write each: ``burst`` runs ``UPDATE_TOUCHED`` (the radixjobs job calls a
procedure with the same UPDATE); in ``ticks`` each body takes its start time as its first statement, and
the peer records (job, planned tick, start) in ``bench.peer_ticks`` (``INSERT_TICK``: procrastinate's
body inserts it; APScheduler's body updates its row of ``bench.touched`` and the peer writes the pairs
after ``stop``, see apscheduler_peer.py). The scenario reads the results from those tables.

The minute workloads (``MINUTE_WORKLOADS``, bench/scenarios/compare_cron.py) give every peer the same cron
expression (``cron_expression``) and the same body, ``CALL bench.cron_work(job, work_ms)``, which records
its start and end; the scenario reads the rest from each scheduler's own history.
"""

from __future__ import annotations

import argparse
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

PEERS = ("procrastinate", "apscheduler", "pg_cron", "pgagent")
MINUTE_WORKLOADS = ("minute-burst", "minutely", "overrun")
UPDATE_TOUCHED = b"UPDATE bench.touched SET n = n + 1, at = clock_timestamp() WHERE id = %s"
INSERT_TICK = (b"INSERT INTO bench.peer_ticks (peer, job, planned, started) "
               b"VALUES (%s, %s, to_timestamp(%s), to_timestamp(%s))")


def peer_arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--workload", choices=("burst", "ticks", *MINUTE_WORKLOADS), required=True)
    parser.add_argument("--jobs", type=int, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--anchor", type=float, default=0.0,
                        help="ticks: epoch second of the first tick (whole second)")
    parser.add_argument("--phase", choices=("spread", "aligned"), default="aligned")
    parser.add_argument("--minute", type=float, default=0.0,
                        help="minute workloads: epoch second of the first due minute (a whole minute)")
    parser.add_argument("--work-ms", type=int, default=0, help="minute workloads: each run's work")
    parser.add_argument("--run-as", default=None, help="minute workloads: the role the jobs run as")
    return parser


def cron_expression(workload: str, first_due: float) -> str:
    """The UTC cron expression of a minute workload: due once, at ``first_due``'s minute of the hour
    (``minute-burst``), or every minute."""
    return f"{int(first_due) // 60 % 60} * * * *" if workload == "minute-burst" else "* * * * *"


def cron_command(job: int, work_ms: int) -> str:
    """The body of minute workload job ``job``: the same SQL for every peer."""
    return f"CALL bench.cron_work({int(job)}, {int(work_ms)})"


def tick_offset(job: int, jobs: int, phase: str) -> float:
    """Seconds after the whole second at which job ``job``'s ticks are due (the same for every peer)."""
    return job / jobs if phase == "spread" else 0.0


def say(word: str) -> None:
    print(word, flush=True)


def hear(expected: str) -> None:
    """Wait for ``expected`` on stdin (end of input counts as ``stop``)."""
    line = sys.stdin.readline().strip()
    if line != expected and not (expected == "stop" and line == ""):
        raise SystemExit(f"peer: expected {expected!r}, got {line!r}")


class PeerProcess:
    """The scenario's side of a peer subprocess."""

    def __init__(self, name: str, dsn: str, workload: str, jobs: int, concurrency: int, *extra: str):
        script = Path(__file__).resolve().parent / f"{name}_peer.py"
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, str(script), "--dsn", dsn, "--workload", workload, "--jobs", str(jobs),
             "--concurrency", str(concurrency), *extra],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.pid = self.proc.pid
        self.lines: queue.Queue[str] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("")  # end of output

    def _expect(self, word: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError(f"peer {self.name}: no {word!r} within {timeout:.0f}s") from None
            if line == word:
                return
            if line == "":
                self.proc.wait(10)
                raise RuntimeError(f"peer {self.name} exited {self.proc.returncode} before {word!r}")

    def _send(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def ready(self, timeout: float = 600.0) -> None:
        self._expect("ready", timeout)

    def go(self) -> None:
        self._send("go")

    def stop(self, timeout: float = 60.0) -> None:
        """Ask it to stop; kill it if it has not stopped within ``timeout``."""
        try:
            if self.proc.poll() is None:
                self._send("stop")
                self._expect("stopped", timeout)
            self.proc.wait(timeout)
        except (OSError, RuntimeError, TimeoutError, subprocess.TimeoutExpired):
            self.kill()
        self.reader.join(10)  # the output ended with the process
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
