"""Node registration: a node is alive exactly as long as its control session (radix.node_alive)."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import psycopg

from radixjobs.errors import ConfigError

# A previous session of the same node id may take a moment to end (a restart right after a close).
REGISTER_TIMEOUT_S = 5.0


async def register_node(dsn: str, node_id: str) -> psycopg.AsyncConnection[Any]:
    """Open the node's control session and register it; ConfigError when the node is alive elsewhere."""
    control = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    deadline = asyncio.get_running_loop().time() + REGISTER_TIMEOUT_S
    try:
        while True:
            cur = await control.execute("SELECT radix.register_node(%s, %s, %s)",
                                        (node_id, socket.gethostname(), os.getpid()))
            row = await cur.fetchone()
            if row and row[0]:
                return control
            if asyncio.get_running_loop().time() > deadline:
                raise ConfigError(f"node {node_id!r} is already alive in another session: "
                                  "give each scheduler its own node id")
            await asyncio.sleep(0.1)
    except BaseException:
        await control.close()
        raise
