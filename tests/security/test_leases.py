"""Lease renewal, frozen defaults and the re-arm fix against hostile roles (issue #12 §2, §4).

- Only the scheduler renews or takes leases: radix.renew_leases and radix.claim_due are not PUBLIC's, so no
  role can keep a dead node's claims alive, extend another node's lease or claim with a lease of its own.
- A procedure's DEFAULT expression is evaluated at CREATE JOB with the creator's rights (never the
  definer's), inside the resolution block that is rolled back: its writes do not survive.
- A role toggling its own job under a running attempt can no longer wedge the claims of every job in the
  database (the stale 'running' history row made each claim fail with a unique violation).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from radixjobs import catalog
from tests.apps import App

PAST = "SCHEDULE AT TIMESTAMP '2000-01-01 00:00:00+00'"


def test_an_ordinary_role_cannot_renew_or_claim_leases(app: App) -> None:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute(f"SET ROLE {app.principal}")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT radix.renew_leases('n', ARRAY[gen_random_uuid()], 86400)")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("SELECT * FROM radix.claim_due('n', 10, true, NULL, 86400)")


def test_a_default_expression_runs_with_the_creators_rights_and_leaves_nothing(app: App, roles: Any) -> None:
    mallory = roles("mallory")
    app.conn.execute(f"""
        CREATE SCHEMA mal AUTHORIZATION {mallory};
        GRANT USAGE ON SCHEMA mal TO PUBLIC;
        SET ROLE {mallory};
        CREATE TABLE mal.loot (who text);
        GRANT INSERT ON mal.loot TO PUBLIC;
        CREATE FUNCTION mal.grab() RETURNS text LANGUAGE plpgsql AS $$
        BEGIN INSERT INTO mal.loot VALUES (current_user); RETURN current_user; END $$;
        CREATE PROCEDURE mal.p(who text DEFAULT mal.grab()) LANGUAGE sql AS $$ SELECT 1 $$;
        GRANT EXECUTE ON PROCEDURE mal.p(text) TO PUBLIC;
        RESET ROLE""")
    creator = app.conn.execute("SELECT current_user").fetchone()
    assert creator is not None
    name = app.job(f"CREATE JOB app.victim {PAST} RUN AS {{p}} CALL mal.p()")
    assert [(a["name"], a["value"]) for a in app.state(name)["arguments"]] == [("who", creator[0])]
    assert app.conn.execute("SELECT count(*) FROM mal.loot").fetchone() == (0,)  # rolled back


def test_toggling_ones_own_job_mid_attempt_does_not_stop_other_tenants(app: App) -> None:
    mine = app.job(f"CREATE JOB app.mine {PAST} RUN AS {{p}} CALL app.record('mine')")
    app.conn.execute("SELECT * FROM radix.claim_due('busy-node', 10)")  # an attempt in progress
    catalog.alter_job(app.conn, mine, enabled=False)
    catalog.alter_job(app.conn, mine, enabled=True)
    theirs = app.job(f"CREATE JOB app.theirs {PAST} RUN AS {{p}} CALL app.record('theirs')")
    app.run()
    assert sorted(e[1] for e in app.effects()) == ["mine", "theirs"]
    assert app.state(theirs)["status"] == "complete"
