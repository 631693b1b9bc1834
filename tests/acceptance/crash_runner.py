"""An engine process that stops at a pause point until it is killed: ``crash_runner DSN POINT MARKER``.

POINT ``batch``: no pause, one slot; every procedure that ran counts as short and a batch is never cancelled
for its length (engine/batches.py), so a test can kill the process while a batch runs. POINT ``upstream``: one
slot, runs due work until the first attempt committed, paused there (``executed``): the jobs that run after it
are queued, and none of them can start."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from radixjobs.engine import Engine, batches, ticks


async def main(dsn: str, point: str, marker: Path) -> None:
    async def pause(reached: str) -> None:
        if reached == point or (point == "upstream" and reached == "executed"):
            await asyncio.to_thread(marker.write_text, reached)
            await asyncio.sleep(3600)  # killed here

    concurrency = 8
    if point == "batch":
        ticks.BATCH_TICK_MS = 60_000.0
        ticks.BATCH_BUDGET_MS = 1e12
        batches.BATCH_RUN_S = 3600.0
        concurrency = 1
    if point == "upstream":
        concurrency = 1
    async with Engine(dsn, node_id="doomed", pause=pause, concurrency=concurrency) as engine:
        await engine.run_due()
        while point == "upstream":  # until the first tick is due and has run
            await engine.wait_for_work(0.1)
            await engine.run_due()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
