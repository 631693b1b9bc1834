"""Run ``radixjobs serve`` subprocesses in tests and talk to their status endpoint."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support import wait_for


class Serve:
    """A ``radixjobs serve`` process with its stderr in a file and its status URL once it is up."""

    def __init__(self, tmp_path: Path, *args: str, env: dict[str, str] | None = None, name: str = "node",
                 preexec_fn: Callable[[], None] | None = None):
        self.log = tmp_path / f"{name}.log"
        base = {k: v for k, v in os.environ.items() if not k.startswith("PG") and k != "RADIXJOBS_DSN"}
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "radixjobs", "serve", "--http", "127.0.0.1:0", "--log-format", "json",
                 "--node-id", name, *args], stdout=subprocess.DEVNULL, stderr=err, env={**base, **(env or {})},
                preexec_fn=preexec_fn)
        self.url = wait_for(self._find_url, timeout=60, message=f"{name} to serve")

    def _find_url(self) -> str | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"serve exited {self.proc.returncode}: {self.log.read_text()[-2000:]}")
        match = re.search(r"status: (http://(?:[0-9.]+|\[[0-9a-f:]+\]):\d+)/status", self.log.read_text())
        return match[1] if match else None

    def get(self, path: str) -> tuple[int, str]:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return response.status, response.read().decode()

    def status(self) -> dict[str, Any]:
        return json.loads(self.get("/status")[1])  # type: ignore[no-any-return]

    def signal(self, signum: int) -> None:
        os.kill(self.proc.pid, signum)

    def wait(self, timeout: float = 60) -> int:
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.signal(signal.SIGKILL)
            self.proc.wait(10)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for line in self.log.read_text().splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
        return lines
