"""Node registration: a node is alive exactly as long as its control session (radix.node_alive); and the
node's one notification connection per database (``listen``)."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from radixjobs.db import abound_lock_waits, scheduler_dsn
from radixjobs.errors import ConfigError

log = logging.getLogger("radixjobs.engine")

# Claims still held under a node id when the node registers come from a previous life of the node
# (kill -9 then a restart with the same node id, or a session lost with a PostgreSQL restart): other nodes
# saw the node alive and left them alone, and its own claim_due would wait out their 5-minute lease.
# Expiring the leases lets them be resumed at once, with the same tick, attempt and key. A backend of that
# previous life that still runs keeps the job safe as always: its KEY SHARE lock (atomic) or its live
# frame (non-atomic) makes every claim skip the job until it is gone.
RESUME_PREVIOUS_CLAIMS = """
UPDATE radix.radix_system_job_state SET lease_expires_at = clock_timestamp(),
    due_ns = radix.to_ns(clock_timestamp())
WHERE lease_node = %s AND status = 'running' AND lease_expires_at > clock_timestamp()
"""

# Where jobs and documents announce a change (radix._hint): hints, never truth (a timer and a poll are).
CHANNELS = ("radix_jobs", "radix_documents")

# A previous session of the same node id may take a moment to end (a restart right after a close).
REGISTER_TIMEOUT_S = 5.0


def default_node_id() -> str:
    """``host:pid`` of this process: the node id when none is given."""
    return f"{socket.gethostname()}:{os.getpid()}"


async def register_node(dsn: str, node_id: str) -> psycopg.AsyncConnection[Any]:
    """Open the node's control session and register it; ConfigError when the node is alive elsewhere."""
    control = await psycopg.AsyncConnection.connect(scheduler_dsn(dsn), autocommit=True)
    await abound_lock_waits(control)
    deadline = asyncio.get_running_loop().time() + REGISTER_TIMEOUT_S
    try:
        while True:
            cur = await control.execute("SELECT radix.register_node(%s, %s, %s)",
                                        (node_id, socket.gethostname(), os.getpid()))
            row = await cur.fetchone()
            if row and row[0]:
                await resume_previous_claims(control, node_id)
                return control
            if asyncio.get_running_loop().time() > deadline:
                raise ConfigError(f"node {node_id!r} is already alive in another session: "
                                  "give each scheduler its own node id")
            await asyncio.sleep(0.1)
    except BaseException:
        await control.close()
        raise


async def resume_previous_claims(control: psycopg.AsyncConnection[Any], node_id: str) -> None:
    cur = await control.execute(RESUME_PREVIOUS_CLAIMS, (node_id,))
    if cur.rowcount:
        log.info("resuming %d claim(s) of this node's previous life node=%s", cur.rowcount, node_id)


async def listen(dsn: str, channels: Sequence[str] = CHANNELS) -> psycopg.AsyncConnection[Any]:
    """A connection listening on ``channels`` (its ``notifies()`` yields a change of a job or a document, and
    whatever else the caller listens to)."""
    conn = await psycopg.AsyncConnection.connect(scheduler_dsn(dsn), autocommit=True)
    try:
        for channel in channels:
            await conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
    except BaseException:
        await conn.close()
        raise
    return conn
