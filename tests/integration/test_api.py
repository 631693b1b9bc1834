"""The Python API as an application uses it."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

import radixjobs
from tests.apps import App


def test_catalog_api_round_trip(app: App) -> None:
    tags = radixjobs.execute(app.conn, f"""
        CREATE PROCEDURE app.cleanup(batch int DEFAULT 10) LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO app.effects(tag) VALUES ('cleanup ' || batch); END $$;
        CREATE JOB app.cleanup SCHEDULE EVERY INTERVAL '5 minutes' RUN AS {app.principal}
            CALL app.cleanup(batch => 1000);
        ALTER JOB app.cleanup DISABLE;
    """)
    assert tags == ["CREATE PROCEDURE", "CREATE JOB", "ALTER JOB"]
    job = radixjobs.get_job(app.conn, "app.cleanup")
    assert job is not None
    assert (job["enabled"], job["definition_version"], job["status"]) == (False, 2, "disabled")
    assert job["arguments"][0]["value"] == "1000"
    assert radixjobs.alter_job(app.conn, "app.cleanup", enabled=True) is True
    stmt = radixjobs.parse_job_statement(
        f"CREATE JOB app.now SCHEDULE AT TIMESTAMP '2020-01-01' RUN AS {app.principal} CALL app.cleanup()")
    assert isinstance(stmt, radixjobs.model.CreateJob)
    job_id = radixjobs.create_job(app.conn, stmt)
    assert [j["name"] for j in radixjobs.list_jobs(app.conn)] == ["app.cleanup", "app.now"]

    async def run() -> int:
        async with radixjobs.Engine(app.dsn) as engine:
            return await engine.run_due()

    assert asyncio.run(run()) == 1
    (entry,) = radixjobs.job_history(app.conn, "app.now")
    assert entry["job_id"] == job_id
    assert entry["status"] == "succeeded"
    assert radixjobs.drop_job(app.conn, "app.now") is True
    assert radixjobs.drop_job(app.conn, "app.now", if_exists=True) is False


def test_errors_are_one_hierarchy(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(radixjobs.RadixError, match=r"statement 1 \(line 1\)"):
        radixjobs.execute(conn, "CREATE JOB nope SCHEDULE EVERY INTERVAL '1 month' RUN AS x CALL a.b()")
