"""An external cluster set up as docs/external.md says: the distribution's PostgreSQL, scram passwords, a
non-superuser scheduler with the documented grants, principals' passwords in a password file.

Every command runs as a subprocess against ``host=127.0.0.1`` with the scheduler's password in
``PGPASSWORD`` (not in the DSN), as a daemon would be deployed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from psycopg import sql

from tests.acceptance.conftest import run_cli
from tests.acceptance.serving import Serve
from tests.apps import App, make_app
from tests.external import SCHEDULER, ExternalDb
from tests.support import wait_for


def radix(db: ExternalDb, *args: str, dsn_extra: str = "") -> subprocess.CompletedProcess[str]:
    """``radixjobs ARGS`` as the daemon runs: scheduler password in PGPASSWORD, principals' in PGPASSFILE."""
    env = db.env(PGPASSWORD=db.cluster.passwords[SCHEDULER])
    return run_cli(*args, "--dsn", f"{db.dsn(password=False)} {dsn_extra}".strip(), env=env)


def job(db: ExternalDb, principal: str, name: str = "once", schedule: str = "AT TIMESTAMP '2020-01-01'") -> str:
    """A job of the superuser's ``app`` schema running as ``principal`` (the schema made on first use)."""
    with db.admin() as conn:
        if conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'app'").fetchone() is None:
            app = make_app(db.dsn(), conn, principal)
        else:
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA app TO {p}; GRANT INSERT, SELECT ON app.effects TO {p}; "
                                 "GRANT USAGE ON SEQUENCE app.effects_id_seq TO {p}").format(
                p=sql.Identifier(principal)))
            app = App(db.dsn(), conn, principal)
        return app.job(f"CREATE JOB app.{name} SCHEDULE {schedule} RUN AS {{p}} CALL app.record('{name}')")


def effects(db: ExternalDb) -> list[tuple[Any, ...]]:
    with db.admin() as conn:
        return conn.execute("SELECT tag, who, sess FROM app.effects ORDER BY id").fetchall()


def history(db: ExternalDb, name: str) -> list[dict[str, Any]]:
    with db.admin() as conn:
        rows = conn.execute("SELECT attempt, status, error FROM radix.job_history WHERE name = %s "
                            "ORDER BY history_id", (name,)).fetchall()
    return [{"attempt": r[0], "status": r[1], "error": r[2]} for r in rows]


def test_the_scheduler_installs_and_owns_the_schema_without_superuser(ext: ExternalDb) -> None:
    with ext.admin() as conn:
        owner, superuser = conn.execute(
            "SELECT n.nspowner::regrole::text, r.rolsuper FROM pg_namespace n JOIN pg_roles r ON r.oid = n.nspowner "
            "WHERE n.nspname = 'radix'").fetchone() or (None, None)
        scram = conn.execute("SELECT rolpassword LIKE 'SCRAM-SHA-256$%%' FROM pg_authid WHERE rolname = %s",
                             (SCHEDULER,)).fetchone()
    assert (owner, superuser) == (SCHEDULER, False)
    assert scram == (True,)
    again = run_cli("install", "--dsn", ext.dsn())
    assert again.returncode == 0, again.stderr
    assert "nothing to do" in again.stdout


def test_a_job_runs_as_its_principal_with_the_password_file(ext: ExternalDb) -> None:
    principal = ext.role("ext_ok")
    job(ext, principal)
    checked = radix(ext, "check", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert report["ok"] is True
    assert report["server_version"] == ext.cluster.version
    assert report["scheduler_grants"] == {"pg_signal_backend": True, "pg_read_all_stats": True}
    assert [(p["principal"], p["ok"], p["used_by"]) for p in report["principals"]] == [(principal, True, ["app.once"])]
    ran = radix(ext, "run", "--once", "--json")
    assert ran.returncode == 0, ran.stderr
    assert json.loads(ran.stdout)["counters"]["successes"] == 1
    assert effects(ext) == [("once", principal, principal)]
    # require_auth (libpq 16+) in the DSN holds for the principals' logins too (docs/external.md)
    strict = radix(ext, "check", "--json", dsn_extra="require_auth=scram-sha-256")
    assert strict.returncode == 0, strict.stdout + strict.stderr
    refused = radix(ext, "check", "--json", dsn_extra="require_auth=md5")  # the client refuses scram
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "authentication method requirement" in refused.stderr


def test_check_says_what_to_fix_per_principal(ext: ExternalDb) -> None:
    good = ext.role("ext_good")
    missing = ext.role("ext_missing", in_passfile=False)
    nologin = ext.role("ext_nologin")  # NOLOGIN once its job exists (admission refuses NOLOGIN principals)
    wrong = ext.role("ext_wrong", in_passfile=False)
    with ext.cluster.passfile.open("a", encoding="utf-8") as fh:
        fh.write(f"127.0.0.1:{ext.cluster.port}:*:{wrong}:not-the-password\n")
    for index, principal in enumerate((good, missing, nologin, wrong)):
        job(ext, principal, name=f"j{index}")
    with ext.admin() as conn:
        conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(nologin)))
    checked = radix(ext, "check", "--json")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    report = {p["principal"]: p for p in json.loads(checked.stdout)["principals"]}
    assert {name: (p["ok"], p["kind"]) for name, p in report.items()} == {
        good: (True, None), missing: (False, "no_password"), nologin: (False, "login_not_permitted"),
        wrong: (False, "authentication_failed")}
    port = ext.cluster.port
    assert f"127.0.0.1:{port}:{ext.name}:{missing}:<password>" in report[missing]["fix"]
    assert str(ext.cluster.passfile) in report[missing]["fix"]
    assert f"ALTER ROLE {nologin} LOGIN" in report[nologin]["fix"]
    assert f"127.0.0.1:{port}:{ext.name}:{wrong}:" in report[wrong]["fix"]

    human = radix(ext, "check")
    assert human.returncode == 1
    assert "3 of 4 principal(s) cannot log in" in human.stdout
    assert f"ALTER ROLE {nologin} LOGIN" in human.stdout
    for password in ext.cluster.passwords.values():  # no password is ever printed
        assert password not in human.stdout + checked.stdout


def test_check_names_the_pg_hba_line(ext: ExternalDb) -> None:
    principal = ext.role("ext_hba")
    job(ext, principal)
    hba = ext.cluster.datadir / "pg_hba.conf"
    original = hba.read_text()
    hba.write_text(f"host all {principal} 127.0.0.1/32 reject\n{original}")
    try:
        with ext.admin() as conn:
            conn.execute("SELECT pg_reload_conf()")
        checked = radix(ext, "check", "--json")
    finally:
        hba.write_text(original)
        with ext.admin() as conn:
            conn.execute("SELECT pg_reload_conf()")
    assert checked.returncode == 1, checked.stdout + checked.stderr
    [entry] = json.loads(checked.stdout)["principals"]
    assert entry["kind"] == "authentication_failed"
    assert f"host {ext.name} {principal} 127.0.0.1/32 scram-sha-256" in entry["fix"]


def test_a_login_failure_ends_the_tick_at_once_with_an_actionable_reason(ext: ExternalDb) -> None:
    principal = ext.role("ext_nopass", in_passfile=False)
    name = job(ext, principal)
    ran = radix(ext, "run", "--once", "--json")
    assert ran.returncode == 0, ran.stderr
    counters = json.loads(ran.stdout)["counters"]
    assert (counters["failures_security"], counters["retries"]) == (1, 0)
    [attempt] = history(ext, name)
    assert (attempt["attempt"], attempt["status"]) == (1, "failed")
    error = attempt["error"]
    assert (error["kind"], error["category"], error["detail"]["scheduler_retryable"]) == \
        ("no_password", "security", False)
    assert error["message"].startswith("authentication failed (redacted): the scheduler's password file has no "
                                       "entry for the principal")
    assert "radixjobs check" in error["message"]
    assert principal not in error["message"]
    assert effects(ext) == []


def test_serve_logs_the_check_once_and_runs_the_jobs_that_can_log_in(ext: ExternalDb, tmp_path: Path) -> None:
    good = ext.role("ext_serve_ok")
    bad = ext.role("ext_serve_bad", in_passfile=False)
    job(ext, good, name="good", schedule="EVERY INTERVAL '1 second'")
    bad_job = job(ext, bad, name="bad", schedule="EVERY INTERVAL '1 second'")
    env = ext.env(PGPASSWORD=ext.cluster.passwords[SCHEDULER])
    server = Serve(tmp_path, "--dsn", ext.dsn(password=False), "--poll", "0.2", env=env)
    try:
        wait_for(lambda: len([e for e in effects(ext) if e[0] == "good"]) >= 2, timeout=60,
                 message="the good job to run twice")
        wait_for(lambda: len(history(ext, bad_job)) >= 2, timeout=60, message="two ticks of the bad job")
        lines = server.log_lines()
    finally:
        server.stop()
    assert {e[1:] for e in effects(ext)} == {(good, good)}
    # never retried: every attempt is a first one, and each failed, except one the stop may have cut off
    # (handed back by the shutdown, or still marked running)
    attempts = history(ext, bad_job)
    assert all(h["attempt"] == 1 for h in attempts), attempts
    assert all(h["status"] == "failed" for h in attempts[:-1]), attempts
    assert attempts[-1]["status"] in ("failed", "released", "running"), attempts
    refused = [line for line in lines if line.get("principal") is not None and "cannot log in" in line["message"]]
    assert [(line["principal"], line["kind"]) for line in refused] == [(bad, "no_password")]
    assert f":{bad}:<password>" in refused[0]["message"]
    text = server.log.read_text()
    for password in ext.cluster.passwords.values():
        assert password not in text


def test_check_on_the_embedded_server(app: Any, cli: Any) -> None:
    """The same check where principals log in over the embedded server's socket (no passwords)."""
    app.job("CREATE JOB app.tick SCHEDULE EVERY INTERVAL '1 hour' RUN AS {p} CALL app.record('tick')")
    checked = cli("check", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert (report["client_addr"], [p["principal"] for p in report["principals"]]) == (None, [app.principal])
    app.conn.execute(sql.SQL("ALTER ROLE {} NOLOGIN").format(sql.Identifier(app.principal)))
    refused = cli("check")
    assert refused.returncode == 1
    assert f"fix {app.principal}: ALTER ROLE {app.principal} LOGIN" in refused.stdout
