"""HA on a real stack (docs/failover.md): ``bench/run.py ha`` on Patroni, etcd and three PostgreSQL 15.

The scenario (bench/scenarios/ha.py) builds the cluster on 127.0.0.1 in a temporary directory, runs two
``radixjobs serve`` on the multi-host DSN with atomic, non-atomic and chained jobs, and puts them through a
``patronictl switchover``, a SIGKILL of the leader's postmaster and a SIGSTOP of the leader. It fails on any
violation: an atomic effect twice, an effect or a success the old leader showed committed missing at the
end, a success without its effect (or the reverse), a ``radix.once()`` effect twice, a chain tick not run to
its end, a daemon that exited or did not stop cleanly. The timings it prints are never asserted.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _missing() -> list[str]:
    """Debian's patroni, etcd-server and postgresql-15, as bench/ha_stack.py runs them."""
    missing = [tool for tool in ("patroni", "patronictl", "etcd") if shutil.which(tool) is None]
    return missing + ([] if Path("/usr/lib/postgresql/15/bin/postgres").exists() else ["postgresql-15"])


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_switchover_kill_and_stall_on_patroni_repeat_and_lose_nothing(tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        if os.environ.get("RADIXJOBS_REQUIRE_PATRONI") or os.environ.get("CI"):
            pytest.fail(f"missing {', '.join(missing)}: .ci/run installs patroni and etcd-server")
        pytest.skip(f"needs {', '.join(missing)}: apt-get install patroni etcd-server postgresql-15")
    run = subprocess.run([sys.executable, str(ROOT / "bench" / "run.py"), "ha", "--json", "--settle", "5",
                          "--stall-hold", "10"], capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert run.stdout.strip(), run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])["ha"]
    print("\n" + json.dumps(result["events"], indent=1))
    assert result["violations_total"] == 0, json.dumps(result, indent=1)
    assert run.returncode == 0, run.stderr[-3000:]
    assert [e["event"] for e in result["events"]] == ["switchover", "kill", "stall"]
    for event in result["events"]:
        assert event["new_leader"] != event["old_leader"]
        assert event["s_to_first_commit_on_new_leader"] is not None, event  # scheduling went on there
    assert result["chain_ticks_complete"] >= 3
