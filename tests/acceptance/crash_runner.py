"""An engine process that stops at a pause point until it is killed: ``crash_runner DSN POINT MARKER``."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from radixjobs.engine import Engine


async def main(dsn: str, point: str, marker: Path) -> None:
    async def pause(reached: str) -> None:
        if reached == point:
            await asyncio.to_thread(marker.write_text, reached)
            await asyncio.sleep(3600)  # killed here

    async with Engine(dsn, node_id="doomed", pause=pause) as engine:
        await engine.run_due()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], Path(sys.argv[3])))
