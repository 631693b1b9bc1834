"""No argument value in any query text a principal's session sends (sql/routines/tick.sql and batch.sql,
engine/definitions.py).

pg_stat_activity shows a session's query text to every session of the same role, so code running as a
principal that two owners share could read the other owner's CALL there. The attacks run through the real path
(an engine running the jobs): a spy of one owner polls pg_stat_activity while the victim owner's tick runs as
the same principal, and the victim's own procedures record current_query() (the text any session of the role
sees) on every path: a lone tick's DO block, a batch's run_ticks, a lease attempt of a committing procedure.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from psycopg import sql

from radixjobs import catalog
from tests.apps import App, run_engine

pytestmark = pytest.mark.usefixtures("batchable")  # batches form whatever the machine's load


SETUP = """
CREATE TABLE app.texts (owner text NOT NULL, text text NOT NULL);
GRANT INSERT, SELECT ON app.texts TO {p};
-- the victim's procedure: what its session shows (current_query() is pg_stat_activity's text for it), then it
-- waits until the spy has seen it (its tick committed what it saw), at most 60 s
CREATE PROCEDURE app.victim(secret text, hold boolean DEFAULT false) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO app.texts VALUES ('victim', current_query());
    IF hold THEN
        FOR i IN 1 .. 1200 LOOP
            EXIT WHEN EXISTS (SELECT 1 FROM app.texts WHERE owner = 'spy');
            PERFORM pg_sleep(0.05);
        END LOOP;
    END IF;
END $$;
-- as the victim's, committing: an attempt on a lease, the CALL in a DO block of its own statement
CREATE PROCEDURE app.victim_commits(secret text) LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO app.texts VALUES ('victim', current_query());
    COMMIT;
END $$;
-- the spy: every text of the other sessions of its role, until one is a radixjobs tick's, at most 60 s
CREATE PROCEDURE app.spy() LANGUAGE plpgsql AS $$
BEGIN
    FOR i IN 1 .. 1200 LOOP
        INSERT INTO app.texts SELECT 'spy', a.query FROM pg_stat_activity a
        WHERE a.usename = current_user AND a.pid <> pg_backend_pid() AND a.query LIKE '%victim%';
        EXIT WHEN FOUND;
        PERFORM pg_sleep(0.05), pg_stat_clear_snapshot();  -- a transaction's view of it is a snapshot
    END LOOP;
END $$;
GRANT EXECUTE ON PROCEDURE app.victim(text, boolean), app.victim_commits(text), app.spy() TO {p};
"""


def _owners(app: App, roles: Any, login: Any) -> tuple[Any, Any]:
    """Two owners who may both act as the app's principal; their connections."""
    app.conn.execute(sql.SQL(SETUP).format(p=sql.Identifier(app.principal)))
    conns = []
    for prefix in ("alice", "bob"):
        owner = roles(prefix)
        app.conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(app.principal), sql.Identifier(owner)))
        app.conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA app TO {}").format(sql.Identifier(owner)))
        conns.append(login(owner))
    return conns[0], conns[1]


def _texts(app: App, owner: str) -> list[str]:
    return [row[0] for row in app.conn.execute("SELECT text FROM app.texts WHERE owner = %s", (owner,))]


def test_a_spy_sharing_the_principal_reads_no_argument_in_pg_stat_activity(app: App, roles: Any,
                                                                             login: Any) -> None:
    alice, bob = _owners(app, roles, login)
    secret = f"s3cret-{uuid.uuid4().hex}"
    catalog.execute_job_ddl(alice, f"CREATE JOB app.victim SCHEDULE AT TIMESTAMP '2020-01-01' "
                                   f"RUN AS {app.principal} CALL app.victim('{secret}', true)")
    catalog.execute_job_ddl(bob, f"CREATE JOB app.spy SCHEDULE AT TIMESTAMP '2020-01-01' "
                                 f"RUN AS {app.principal} CALL app.spy()")
    engine = run_engine(app.dsn, lambda e: e.run_due(), concurrency=4, max_per_principal=0)
    assert engine.counters["successes"] == 2
    seen = _texts(app, "spy")
    assert any("app" in text and "victim" in text for text in seen), seen  # the spy did read the tick's text
    assert not any(secret in text for text in seen)


@pytest.mark.parametrize("kind", ["lone tick", "batch", "lease"])
def test_no_path_puts_an_argument_in_the_query_text(app: App, roles: Any, login: Any, kind: str) -> None:
    alice, _ = _owners(app, roles, login)
    secret = f"s3cret-{uuid.uuid4().hex}"
    procedure = "app.victim_commits" if kind == "lease" else "app.victim"
    count = 5 if kind == "batch" else 1
    options = "WITH (batch = on)" if kind == "batch" else ""
    if kind == "batch":  # the lead runs alone, then the backlog in a batch
        app.job("CREATE JOB app.lead SCHEDULE AT TIMESTAMP '2019-01-01' RUN AS {p} CALL app.victim('lead') " + options)
    for i in range(count):
        catalog.execute_job_ddl(alice, f"CREATE JOB app.v{i} SCHEDULE AT TIMESTAMP '2020-01-0{i + 1}' "
                                       f"RUN AS {app.principal} CALL {procedure}(secret => '{secret}-{i}') {options}")
    engine = run_engine(app.dsn, lambda e: e.run_due(), concurrency=1)
    assert engine.counters["successes"] == count + (1 if kind == "batch" else 0)
    if kind == "batch":
        assert engine.counters["batched_ticks"] >= 2
    texts = _texts(app, "victim")
    assert len(texts) == engine.counters["successes"]
    assert not any(secret in text for text in texts), texts
