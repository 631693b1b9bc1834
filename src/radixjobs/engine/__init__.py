"""The scheduler engine for one database: find a tick and run it in one transaction as its principal, or
claim → execute as the principal → finalise (the lease path). engine/runner.py composes the parts.

Glossary (one meaning each, in the code and in the docs):
- tick: one planned run of a job, named by the job and its planned time (``planned_ns``), run by one or
  more attempts (retries). A tick is *found* (radix.find_ticks, no row written) or *claimed*.
- claim: a tick taken by this node as a lease (radix.claim_due, or radix.claim_tick for a found tick that
  did not commit): the ``Claim`` of engine/attempt.py, with its lease token. The counter ``claims`` counts
  every tick this engine started, found or claimed.
- lease: a claim's hold on its tick: ``lease_s`` seconds, renewed while its attempt runs
  (engine/leases.py), fenced by its token; a lease lost (re-armed, dropped, node declared dead) ends its
  attempt, whose outcome is then not recorded.
- attempt: one run of a tick's procedure as the job's principal, on the principal's connection
  (principals.PrincipalAttempt), with its outcome (``Outcome``) recorded once: in the tick's own
  transaction (a one-transaction tick), or by radix.finish_attempt under the lease (the lease path).
- frame: what a running attempt's procedure reads of its tick (radix.current_*(), radix.once()): a frame
  row, or in a batch the transaction's setting ``radix.tick``, verified by a MAC; a query names an attempt
  by the MAC of its token for its backend, never by the token itself.
- batch: up to ``BATCH_MAX`` found ticks of one principal, one owner and one procedure run as one
  transaction on one connection, each in its own subtransaction (engine/batches.py).
- slot: room for one attempt (engine/slots.py); an engine's slots are a share of its parent's.
- in flight: what is running here, and what it holds (engine/inflight.py).
"""

from radixjobs.engine.attempt import Claim, Outcome
from radixjobs.engine.nodes import default_node_id
from radixjobs.engine.runner import Engine

__all__ = ["Claim", "Engine", "Outcome", "default_node_id"]
