-- WITH (batch = on): the job's owner declares its procedure safe to share a transaction with other ticks
-- (tick batches: engine/batches.py). Off by default, and for every job that existed before: a job runs each
-- attempt in its own transaction unless its owner said otherwise.
ALTER TABLE radix.jobs ADD COLUMN batch_ticks boolean NOT NULL DEFAULT false;
