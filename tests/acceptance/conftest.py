"""Acceptance tests run the real ``radixjobs`` command in subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from radixjobs.embedded import EmbeddedServer

Run = Callable[..., subprocess.CompletedProcess[str]]


def run_cli(*args: str, env: dict[str, str] | None = None, input: str | None = None,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("PG") and k not in ("RADIXJOBS_DSN", "RADIXJOBS_HOME")}
    return subprocess.run([sys.executable, "-m", "radixjobs", *args], capture_output=True, text=True,
                          env={**base, **(env or {})}, input=input, timeout=timeout)


@pytest.fixture
def cli_home(tmp_path: Path) -> Iterator[Path]:
    """A private embedded-server home; whatever runs there is stopped afterwards."""
    home = tmp_path / "home"
    yield home
    run_cli("db", "stop", "--home", str(home))
    EmbeddedServer(home).destroy()  # as root the cluster may live outside the home (/var/lib/radixjobs)


@pytest.fixture
def cli(db: str) -> Run:
    """Run radixjobs against the test's database."""

    def run(*args: str, input: str | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return run_cli(*args, env={"RADIXJOBS_DSN": db}, input=input, timeout=timeout)

    return run
