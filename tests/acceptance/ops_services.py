"""CSP services for tests/acceptance/test_ops.py (imported by the spawned worker processes)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any


def sleeper(params: Any) -> None:
    """Writes its pid to params["pid_file"], sleeps params["seconds"], then writes "done" to params["done_file"]."""
    Path(params["pid_file"]).write_text(str(os.getpid()), encoding="utf-8")
    time.sleep(float(params["seconds"]))
    Path(params["done_file"]).write_text("done", encoding="utf-8")


def marker(params: Any) -> None:
    """Writes "ran" to params["path"]."""
    Path(params["path"]).write_text("ran", encoding="utf-8")
