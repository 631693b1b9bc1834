"""``radixjobs run``: one database's due jobs in the foreground."""

from __future__ import annotations

from typing import Any

import click

from radixjobs.cli.common import (
    Options,
    check_reserved_slots,
    common_options,
    emit,
    ensure_schema,
    max_per_principal_option,
    reserve_options,
    tick_batch_option,
)
from radixjobs.config import open_target
from radixjobs.db import connect


@click.command("run")
@click.option("--once", "once", is_flag=True, help="Run what is due now, then exit.")
@click.option("--for", "seconds", type=click.FloatRange(min=0), default=None, metavar="SECONDS",
              help="Run due work as it comes due for SECONDS, then exit.")
@click.option("--node-id", default=None, help="This node's id (default host:pid).")
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(1, 256),
              help="Attempts run at the same time.")
@max_per_principal_option("half of --concurrency")
@reserve_options("the --concurrency")
@tick_batch_option
@click.option("--lease-seconds", default=300, show_default=True, type=click.IntRange(3, 86_400), metavar="N",
              help="Claim lease; renewed every N/3 s while the attempt runs, so it bounds how long a dead "
                   "node's claim blocks a job, not how long a job may run.")
@common_options
def run_command(opts: Options, once: bool, seconds: float | None, node_id: str | None, concurrency: int,
                max_per_principal: int | None, reserved_slots: int | None, long_attempt: float, tick_batch: int,
                lease_seconds: int) -> None:
    """Run due jobs of one database in the foreground (the daemon is `serve`)."""
    import asyncio

    from radixjobs.engine import Engine

    if once == (seconds is not None):
        raise click.UsageError("give exactly one of --once or --for SECONDS")
    check_reserved_slots(reserved_slots, concurrency, "--concurrency")

    async def go(dsn: str) -> dict[str, Any]:
        async with Engine(dsn, node_id=node_id, concurrency=concurrency,
                          max_per_principal=max_per_principal, lease_s=lease_seconds, tick_batch=tick_batch,
                          reserved_slots=reserved_slots, long_attempt_s=long_attempt) as engine:
            ran = await engine.run_due() if once else await engine.run_for(seconds or 0.0)
            return {"attempts": ran, "node": engine.node_id, "counters": dict(engine.counters),
                    "last_error": engine.last_error}

    with open_target(opts.dsn, opts.home) as target:
        with connect(target.dsn) as conn:
            ensure_schema(conn, target)
        result = asyncio.run(go(target.dsn))
    counters = ", ".join(f"{k}={v}" for k, v in sorted(result["counters"].items())) or "none"
    emit(opts, result, f"ran {result['attempts']} attempt(s) on node {result['node']}; counters: {counters}")
