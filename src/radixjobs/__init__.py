"""radixjobs: a durable, SQL-native job scheduler for PostgreSQL.

Sync catalog API (psycopg connections)::

    import psycopg, radixjobs
    with psycopg.connect(dsn, autocommit=True) as conn:
        radixjobs.install(conn)
        radixjobs.execute(conn, "CREATE JOB app.cleanup SCHEDULE EVERY INTERVAL '5 minutes' "
                                "RUN AS worker CALL app.cleanup(batch => 1000)")
        radixjobs.list_jobs(conn)

Embedding the scheduler (asyncio)::

    async with radixjobs.Engine(dsn) as engine:      # one database, in the foreground
        await engine.run_for(60)
    await radixjobs.Daemon(radixjobs.DaemonConfig(dsn=dsn)).run()   # what `radixjobs serve` runs
"""

from radixjobs.catalog import (
    alter_job,
    backfill_job,
    create_job,
    drop_job,
    execute_job_ddl,
    get_job,
    job_history,
    list_jobs,
    run_job,
)
from radixjobs.config import open_target, resolve_dsn
from radixjobs.ddl import parse_job_statement
from radixjobs.embedded import EmbeddedServer
from radixjobs.engine import Engine
from radixjobs.errors import (
    AdmissionError,
    ConfigError,
    ConnectError,
    ParseError,
    RadixError,
    ScheduleError,
    SchemaError,
    StatementError,
)
from radixjobs.migrate import check_ready, code_version, install
from radixjobs.scripts import execute
from radixjobs.server import Daemon, DaemonConfig

__all__ = [
    "AdmissionError",
    "ConfigError",
    "ConnectError",
    "Daemon",
    "DaemonConfig",
    "EmbeddedServer",
    "Engine",
    "ParseError",
    "RadixError",
    "ScheduleError",
    "SchemaError",
    "StatementError",
    "alter_job",
    "backfill_job",
    "check_ready",
    "code_version",
    "create_job",
    "drop_job",
    "execute",
    "execute_job_ddl",
    "get_job",
    "install",
    "job_history",
    "list_jobs",
    "open_target",
    "parse_job_statement",
    "resolve_dsn",
    "run_job",
]
