"""The scheduler engine: claim → execute as the principal → finalise, for one database."""

from radixjobs.engine.attempt import Claim, Outcome
from radixjobs.engine.runner import Engine, default_node_id

__all__ = ["Claim", "Engine", "Outcome", "default_node_id"]
