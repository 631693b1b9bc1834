"""The scheduler engine for one database: find a tick and run it in one transaction as its principal, or
claim → execute as the principal → finalise (the lease path)."""

from radixjobs.engine.attempt import Claim, Outcome
from radixjobs.engine.nodes import default_node_id
from radixjobs.engine.runner import Engine

__all__ = ["Claim", "Engine", "Outcome", "default_node_id"]
