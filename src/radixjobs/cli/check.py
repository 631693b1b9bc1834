"""``radixjobs check``: can every principal of an enabled job or active document log in from this node?

Logs in as each principal exactly as the engine would (radixjobs.preflight) and says per principal what
to fix. Exit code 0 when all can log in, 1 when one cannot (and on any error, as every command: connecting
as a role that is not the scheduler is one, a single line naming both roles, before any login).
"""

from __future__ import annotations

import asyncio
import sys

import click

from radixjobs import output, preflight
from radixjobs.cli.common import Options, common_options, emit, ensure_schema
from radixjobs.config import open_target
from radixjobs.db import connect


@click.command("check")
@click.option("--timeout", "timeout_s", default=preflight.CONNECT_TIMEOUT_S, show_default=True,
              type=click.IntRange(2, 60), metavar="SECONDS", help="Connect timeout of each principal's login.")
@common_options
def check_command(opts: Options, timeout_s: int) -> None:
    """Check that every principal in use can log in from this node, and say what to fix when not."""
    with open_target(opts.dsn, opts.home) as target:
        with connect(target.dsn) as conn:
            ensure_schema(conn, target)
        ctx, checks = asyncio.run(preflight.check_principals(target.dsn, timeout_s=timeout_s))
    failed = [c for c in checks if not c.ok]
    grants = {"pg_signal_backend": ctx.signal_backend, "pg_read_all_stats": ctx.read_all_stats}
    value = {"database": ctx.database, "scheduler": ctx.scheduler, "server_version": ctx.server_major,
             "client_addr": ctx.client_addr, "passfile": ctx.passfile, "os_user": ctx.os_user,
             "scheduler_grants": grants,
             "ok": not failed, "principals": [c.to_json() for c in checks]}
    rows = [(c.principal, "ok" if c.ok else "FAILED", len(c.used_by), c.kind or "") for c in checks]
    lines = [f"database {ctx.database} on PostgreSQL {ctx.server_major}, scheduler {ctx.scheduler}, "
             f"logins from {ctx.client_addr or 'a unix socket'} as OS user {ctx.os_user}, password file "
             f"{ctx.passfile}"]
    for grant, held in grants.items():
        if not held:
            lines.append(f"warning: the scheduler lacks {grant}: GRANT {grant} TO {ctx.scheduler} "
                         "(docs/external.md)")
    lines.append(output.render_table(["principal", "login", "jobs", "kind"], rows))
    lines.extend(f"fix {c.principal}: {c.fix}" for c in failed)
    lines.append(f"{len(failed)} of {len(checks)} principal(s) cannot log in" if failed
                 else f"all {len(checks)} principal(s) can log in")
    emit(opts, value, "\n".join(lines))
    if failed:
        sys.exit(1)  # (ctx.exit's code is dropped by cli.main's standalone_mode=False)
