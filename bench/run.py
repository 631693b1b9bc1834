"""Benchmarks of radixjobs: ``python bench/run.py SCENARIO [--json] [options]``.

Scenarios: baseline, throughput, floor, tickcost, lateness, soak, scale, failover, clusters, compare, profile, ha
(see docs/benchmarks.md). Each creates its own embedded server in a temporary directory (or uses ``--dsn``, a
superuser DSN, or ``--pg-bin``: an embedded server from another PostgreSQL's binaries) and its own database; ``ha``
builds its own Patroni cluster instead (``run_own_servers``), and takes none of those three options.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import bench_database, emit, parse_settings

SCENARIOS = ("baseline", "throughput", "floor", "tickcost", "lateness", "soak", "scale", "failover", "clusters",
             "compare", "profile", "ha")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.splitlines()[0])
    commands = top.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for name in SCENARIOS:
        module = importlib.import_module(f"scenarios.{name}")
        sub = commands.add_parser(name, help=(module.__doc__ or "").splitlines()[0])
        sub.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
        sub.add_argument("--dsn", default=None, help="superuser DSN of a server to use instead of an embedded one")
        sub.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                         help="a setting of the embedded server (repeatable), e.g. synchronous_commit=off")
        sub.add_argument("--pg-bin", type=Path, default=None, metavar="DIR",
                         help="run the embedded server from these PostgreSQL binaries (another major: "
                              "scripts/postgres_versions.py bin MAJOR)")
        module.add_arguments(sub)
    return top


def main() -> None:
    top = parser()
    args = top.parse_args()
    module = importlib.import_module(f"scenarios.{args.scenario}")
    if hasattr(module, "run_own_servers"):
        if args.dsn or args.setting or args.pg_bin:
            top.error(f"{args.scenario} builds its own servers: --dsn, --setting and --pg-bin do not apply")
        result, version = module.run_own_servers(args)
        emit(args.scenario, result, args.json, getattr(module, "render", None), version)
        return
    # a scenario may bring its own server (compare: a distribution PostgreSQL with pg_cron preloaded)
    server = getattr(module, "server", None)
    with server(args) if server else contextlib.nullcontext(args.dsn) as dsn:
        settings = {**(getattr(module, "SETTINGS", {}) if dsn is None else {}), **parse_settings(args.setting)}
        with bench_database(args.scenario, dsn, settings, args.pg_bin) as db:
            result = module.run(db, args)
            server_version = db.server_version()
    emit(args.scenario, result, args.json, getattr(module, "render", None), server_version)


if __name__ == "__main__":
    main()
