"""Attacks through job dependencies (sql/routines/dependencies.sql): a tenant that may create jobs makes one
run after another owner's job, to trigger its own runs at that job's times (learning when it runs), or to
pin the other owner's job (RESTRICT). Through the real path: the tenant's own connection calling the public
SQL function."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.apps import App


def test_a_role_depends_only_on_jobs_whose_owner_it_acts_for(app: App, roles: Any, login: Any) -> None:
    app.job("CREATE JOB app.theirs SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('theirs')")
    tenant = roles("tenant")
    app.conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA app TO {0}; GRANT {1} TO {0}").format(
        sql.Identifier(tenant), sql.Identifier(app.principal)))
    conn = login(tenant)
    create = ("SELECT radix.create_job('app.mine', %s::jsonb, %s::text, 'app.record', "
              "'[{\"kind\": \"string\", \"value\": \"mine\"}]'::jsonb)")
    with pytest.raises(psycopg.errors.UndefinedObject, match=r"job app\.theirs does not exist"):
        conn.execute(create.encode(), ('{"after": ["app.theirs"]}', app.principal))
    assert app.conn.execute("SELECT count(*) FROM radix.job_edges").fetchone() == (0,)


def test_an_edge_whose_owner_lost_the_right_does_not_fire_and_hides_the_upstream(app: App, roles: Any,
                                                                                 login: Any) -> None:
    owner, tenant = roles("owner"), roles("tenant")
    for role in (owner, tenant):
        app.conn.execute(sql.SQL("GRANT USAGE, CREATE ON SCHEMA app TO {0}; GRANT {1} TO {0}").format(
            sql.Identifier(role), sql.Identifier(app.principal)))
    app.conn.execute(sql.SQL("GRANT {} TO {}").format(sql.Identifier(owner), sql.Identifier(tenant)))
    create = ("SELECT radix.create_job(%s::text, %s::jsonb, %s::text, 'app.record', "
              "jsonb_build_array(jsonb_build_object('kind', 'string', 'value', %s::text)))")
    login(owner).execute(create.encode(), ("app.up", '{"at": "2020-01-01"}', app.principal, "up"))
    theirs = login(tenant)
    theirs.execute(create.encode(), ("app.dep", '{"after": ["app.up"]}', app.principal, "dep"))
    app.conn.execute(sql.SQL("REVOKE {} FROM {}").format(sql.Identifier(owner), sql.Identifier(tenant)))
    row = theirs.execute("SELECT schedule, upstreams FROM radix.job_overview WHERE name = 'app.dep'").fetchone()
    assert row == ("AFTER (hidden) SUCCEEDS", [{"job": "(hidden)", "on": "succeeds"}])
    app.run()
    app.run()
    assert [e[1] for e in app.effects()] == ["up"]
    assert app.conn.execute("SELECT count(*) FROM radix.job_requests").fetchone() == (0,)
