"""Job groups (``CREATE JOB GROUP … WITH (max_running = N)``, ``WITH (group = …)``): at most max_running
attempts of a group's jobs run at once, across every node; the DDL's errors; who may join a group; a group
in use cannot be dropped. Two engines run at once; each attempt records when it ran (its transaction's
start and its procedure's end, both inside the time its claim holds a place), and the test waits for the
records, never for a fixed time."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from radixjobs import catalog
from radixjobs.errors import AdmissionError, ParseError
from tests.apps import App, Background, found_ticks
from tests.support import wait_for

SPANS_SQL = """
CREATE TABLE app.spans (tag text, started timestamptz, ended timestamptz);
GRANT INSERT ON app.spans TO {p};
CREATE PROCEDURE app.slow(tag text) LANGUAGE plpgsql AS $$
BEGIN
  PERFORM pg_sleep(1);
  INSERT INTO app.spans VALUES (tag, now(), clock_timestamp());
END $$;
"""


def _spans_table(app: App) -> None:
    for stmt in SPANS_SQL.replace("{p}", app.principal).split(";\nCREATE PROCEDURE"):
        app.conn.execute(stmt if stmt.startswith("\nCREATE TABLE") else "CREATE PROCEDURE" + stmt)


def _grouped_jobs(app: App, group: str, count: int) -> list[str]:
    names = [app.job(f"CREATE JOB app.g{i} SCHEDULE EVERY INTERVAL '1 hour' RUN AS {{p}} CALL app.slow('g{i}') "
                     f"WITH (group = '{group}')") for i in range(count)]
    for name in names:
        app.make_due(name)
    return names


def _most_at_once(app: App) -> int:
    """The most attempts whose recorded spans overlap at one instant."""
    rows = app.conn.execute("SELECT started, ended FROM app.spans").fetchall()
    edges = sorted([(s, 1) for s, _ in rows] + [(e, -1) for _, e in rows], key=lambda x: (x[0], x[1]))
    level = top = 0
    for _, step in edges:
        level += step
        top = max(top, level)
    return top


def _run_two_engines(app: App, count: int) -> None:
    with Background(app.dsn, node_id="group-a", concurrency=4), \
            Background(app.dsn, node_id="group-b", concurrency=4):
        wait_for(lambda: app.conn.execute("SELECT count(*) FROM app.spans").fetchone() == (count,), timeout=60)


def test_max_running_caps_a_group_across_two_engines(app: App) -> None:
    _spans_table(app)
    catalog.execute_job_ddl(app.conn, "CREATE JOB GROUP etl WITH (max_running = 2)")
    names = _grouped_jobs(app, "etl", 6)
    _run_two_engines(app, 6)
    assert _most_at_once(app) == 2
    assert sorted(r[0] for r in app.conn.execute("SELECT tag FROM app.spans").fetchall()) == \
        sorted(f"g{i}" for i in range(6))
    nodes = {h["node"] for name in names for h in app.history(name)}
    assert nodes <= {"group-a", "group-b"}
    assert all(h["status"] == "succeeded" for name in names for h in app.history(name))


def test_max_running_one_serialises_the_group(app: App) -> None:
    _spans_table(app)
    catalog.execute_job_ddl(app.conn, "CREATE JOB GROUP solo WITH (max_running = 1)")
    _grouped_jobs(app, "solo", 3)
    _run_two_engines(app, 3)
    assert _most_at_once(app) == 1


def test_a_job_in_no_group_is_not_held_by_a_full_one(app: App) -> None:
    _spans_table(app)
    catalog.execute_job_ddl(app.conn, "CREATE JOB GROUP solo WITH (max_running = 1)")
    _grouped_jobs(app, "solo", 2)
    free = app.job("CREATE JOB app.free SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.slow('free')")
    app.make_due(free)
    _run_two_engines(app, 3)
    assert _most_at_once(app) == 2  # the free job ran beside the group's one place


def _error(app: App, ddl: str) -> AdmissionError:
    with pytest.raises(AdmissionError) as caught:
        catalog.execute_job_ddl(app.conn, ddl)
    assert "\n" not in str(caught.value)
    return caught.value


def test_group_ddl_and_its_errors(app: App) -> None:
    catalog.execute_job_ddl(app.conn, "CREATE JOB GROUP etl WITH (max_running = 2)")
    assert _error(app, "CREATE JOB GROUP etl WITH (max_running = 3)").code == "42710"
    assert catalog.execute_job_ddl(app.conn, "CREATE JOB GROUP IF NOT EXISTS etl WITH (max_running = 3)") \
        == "CREATE JOB GROUP"
    for bad in ("CREATE JOB GROUP x WITH (max_running = 0)", "CREATE JOB GROUP x WITH (max_running = 'two')",
                "CREATE JOB GROUP x WITH (other = 1)", "CREATE JOB GROUP s.x WITH (max_running = 1)",
                "ALTER JOB GROUP etl SET (max_running = 10001)", "ALTER JOB GROUP etl RESET (other)"):
        with pytest.raises(ParseError):
            catalog.execute_job_ddl(app.conn, bad)
    with pytest.raises(AdmissionError, match="max_running must be an integer from 1 to 10000"):
        catalog.create_job_group(app.conn, "y", 0)  # the SQL API checks the value again
    assert _error(app, "ALTER JOB GROUP nosuch SET (max_running = 2)").code == "42704"
    catalog.execute_job_ddl(app.conn, "ALTER JOB GROUP etl SET (max_running = 3)")
    assert [(g["name"], g["max_running"]) for g in catalog.list_job_groups(app.conn)] == [("etl", 3)]
    catalog.execute_job_ddl(app.conn, "ALTER JOB GROUP etl RESET (max_running)")
    assert catalog.list_job_groups(app.conn)[0]["max_running"] == 1
    err = _error(app, f"CREATE JOB app.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS {app.principal} CALL app.record('j') "
                      "WITH (group = 'nosuch')")
    assert err.code == "42704"
    assert "nosuch" in str(err)


def test_joining_leaving_and_dropping_a_group(app: App) -> None:
    catalog.execute_job_ddl(app.conn, "CREATE JOB GROUP etl WITH (max_running = 2)")
    name = app.job("CREATE JOB app.j SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('j')")
    app.job("CREATE JOB app.k SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('k') "
            "WITH (group = etl)")
    catalog.execute_job_ddl(app.conn, f"ALTER JOB {name} SET (group = 'etl')")
    assert app.state(name)["group_name"] == "etl"
    err = _error(app, "DROP JOB GROUP etl")
    assert err.code == "2BP01"
    assert "app.j" in str(err)
    assert "app.k" in str(err)
    assert "2 job(s)" in str(err)
    catalog.execute_job_ddl(app.conn, f"ALTER JOB {name} RESET (group)")
    catalog.execute_job_ddl(app.conn, "DROP JOB app.k")
    assert app.state(name)["group_name"] is None
    assert catalog.execute_job_ddl(app.conn, "DROP JOB GROUP etl") == "DROP JOB GROUP"
    assert catalog.list_job_groups(app.conn) == []
    assert catalog.execute_job_ddl(app.conn, "DROP JOB GROUP IF EXISTS etl") == "DROP JOB GROUP"
    assert _error(app, "DROP JOB GROUP etl").code == "42704"
    # a job that ran in a group runs on its own path again once it left
    app.make_due(name)
    assert app.run().counters["successes"] == 1


def _owner(app: App, roles: Any, prefix: str) -> str:
    owner: str = roles(prefix)
    app.conn.execute(f"GRANT {app.principal} TO {owner}")
    app.conn.execute(f"GRANT CREATE ON SCHEMA app TO {owner}")
    return owner


def test_only_the_group_owners_jobs_join_and_others_do_not_see_it(app: App, roles: Any) -> None:
    alice, bob, carol = (_owner(app, roles, p) for p in ("alice", "bob", "carol"))
    app.conn.execute(f"GRANT {alice} TO {carol}")  # carol is a member of alice
    create = ("CREATE JOB app.{} SCHEDULE EVERY INTERVAL '1 hour' RUN AS " + app.principal +
              " CALL app.record('x') WITH (group = 'etl')")
    with psycopg.connect(app.dsn, user=alice, autocommit=True) as as_alice:
        catalog.execute_job_ddl(as_alice, "CREATE JOB GROUP etl WITH (max_running = 1)")
        catalog.execute_job_ddl(as_alice, create.format("a"))
    with psycopg.connect(app.dsn, user=carol, autocommit=True) as as_carol:
        catalog.execute_job_ddl(as_carol, create.format("c"))
        assert [g["name"] for g in catalog.list_job_groups(as_carol)] == ["etl"]
    with psycopg.connect(app.dsn, user=bob, autocommit=True) as as_bob:
        with pytest.raises(AdmissionError) as denied:
            catalog.execute_job_ddl(as_bob, create.format("b"))
        assert denied.value.code == "42501"
        assert "permission denied" in str(denied.value)
        catalog.execute_job_ddl(as_bob, create.format("b").replace(" WITH (group = 'etl')", ""))
        with pytest.raises(AdmissionError) as denied:
            catalog.execute_job_ddl(as_bob, "ALTER JOB app.b SET (group = 'etl')")
        assert denied.value.code == "42501"
        assert catalog.list_job_groups(as_bob) == []
        for ddl in ("ALTER JOB GROUP etl SET (max_running = 5)", "DROP JOB GROUP etl"):
            with pytest.raises(AdmissionError) as hidden:
                catalog.execute_job_ddl(as_bob, ddl)
            assert hidden.value.code == "42704"
    assert app.state("app.b")["group_name"] is None


def _claimed(app: App, node: str, limit: int) -> list[str]:
    rows = app.conn.execute("SELECT o.name FROM radix.claim_due(%s, %s) c JOIN radix.job_overview o USING (job_id) "
                            "ORDER BY o.name", (node, limit)).fetchall()
    return [r[0] for r in rows]


def test_a_claim_takes_the_free_places_oldest_due_first_and_a_full_group_is_not_due(app: App) -> None:
    _spans_table(app)
    catalog.execute_job_ddl(app.conn, "CREATE JOB GROUP etl WITH (max_running = 2)")
    names = _grouped_jobs(app, "etl", 4)
    for age, name in enumerate(names):  # app.g3 came due first, then app.g2, …
        app.conn.execute("UPDATE radix.radix_system_job_state SET due_ns = radix.to_ns(clock_timestamp()) - %s "
                         "WHERE job_id = (SELECT job_id FROM radix.job_overview WHERE name = %s)",
                         ((age + 1) * 10**9, name))
    assert found_ticks(app) == []  # a grouped job's ticks are claimed, never found
    app.conn.execute("SELECT radix.register_node('m', 'localhost', 0)")
    assert _claimed(app, "n", 10) == ["app.g2", "app.g3"]
    assert _claimed(app, "m", 10) == []
    due = app.conn.execute("SELECT radix.lease_work_due('n'), radix.next_due_in(0), radix.next_due_in(1)").fetchone()
    assert due is not None
    assert due[0] is False
    assert due[1] > 60  # the group's next place frees when a lease ends, not now
    assert due[2] is None or due[2] > 60
    catalog.execute_job_ddl(app.conn, "ALTER JOB GROUP etl SET (max_running = 3)")
    assert _claimed(app, "m", 10) == ["app.g1"]
