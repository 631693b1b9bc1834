"""Importers that turn other schedulers' jobs into radixjobs jobs, through the one admission path."""

from radixjobs.imports.pg_cron import Outcome, import_pg_cron

__all__ = ["Outcome", "import_pg_cron"]
