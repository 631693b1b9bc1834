"""The daemon's settings (``radixjobs serve``'s options, cli/serve.py): one field per option.

Invariants:
- plain values, read by the daemon (server/daemon.py) and its cluster supervisors (server/clusters.py),
  which both import this module and neither of which it imports; nothing here opens a connection;
- a field that is ``None`` is derived from the others where it is used, as its comment says.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from radixjobs.engine.batches import BATCH_MAX
from radixjobs.engine.leases import DEFAULT_LEASE_S
from radixjobs.engine.nodes import default_node_id
from radixjobs.fairness import LONG_ATTEMPT_S


@dataclass
class DaemonConfig:
    """What ``radixjobs serve`` was asked for; ``Daemon(config)`` serves it."""

    dsn: str
    all_databases: bool = False
    node_id: str = field(default_factory=default_node_id)
    concurrency: int = 32
    per_database_concurrency: int = 16
    max_per_principal: int | None = None  # running attempts per principal and database; None: half the above
    grace_s: float = 30.0
    poll_s: float = 1.0
    discovery_s: float = 5.0
    services: dict[str, str] = field(default_factory=dict)  # CSP services allowed besides entry points
    lease_s: int = DEFAULT_LEASE_S  # claim lease, renewed every third of it while the attempt runs
    extra_dsns: list[str] = field(default_factory=list)  # further targets (serve --dsn repeated)
    per_cluster_concurrency: int | None = None  # slots per target; None: --concurrency split evenly
    tick_batch: int = BATCH_MAX  # ticks per batch under a backlog (engine/batches.py); 1: each tick alone
    reserved_slots: int | None = None  # per database: slots long attempts may not hold; None: a quarter
    long_attempt_s: float = LONG_ATTEMPT_S  # an attempt whose job's timeout is above this is long
    notify_url: str | None = None  # radix_events POSTed here as JSON (server/events.py); None: not posted
