"""The command line with random arguments: never a traceback; an error is a non-zero exit with a message.

Each example runs the real entry point, ``radixjobs.cli.main`` (``cli.main`` plus the translation of errors
into one line that users see), inside click's CliRunner isolation. Nothing can reach a real server: the DSN
is a socket that does not exist, the embedded home is a temporary directory, ``db start`` is never
generated, ``status`` is pointed at a closed port, and ``--dsn``, ``--home`` and ``--http`` are never
taken from the random part.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import click
import pytest
from click.testing import CliRunner
from hypothesis import assume, given
from hypothesis import strategies as st

from radixjobs.cli import cli, main
from tests.fuzz import fuzz_settings

NOWHERE = "host=/nonexistent dbname=radix"
FORBIDDEN = ("--dsn", "--home", "--http")
NEVER = [("db", "start")]  # would start a real embedded server
WORDS = ["", "-", "--", "x", "a.b", "app.job", "0", "-1", "1e309", "nan", "inf", "off", "127.0.0.1:0", "a:b",
         "name=os:system", "x=", "=y", "{}", "[", "select 1", "CREATE JOB", "é", " ", "--json", "-h", "--help",
         "--version", "--bogus", "-z", "--once", "--for", "--limit", "101", "9" * 30, "\t\n"]



def ARG_TEXT(size: int) -> st.SearchStrategy[str]:
    """Text a real command line can carry: argv entries are C strings, so never a NUL byte."""
    return st.text(st.characters(blacklist_characters="\x00"), max_size=size)

def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        elif (*path, name) not in NEVER:
            yield (*path, name), command


COMMANDS = list(_commands(cli))
GROUPS = [("db",), ("docs",), ("jobs",)]


# click.File opens a file while parsing and leaves it to the context to close, which a usage error raised
# later in parsing never does: the process exits at once, so only a test that goes on sees the file left
# open. Those files are collected with their warning ignored (a full collection per example costs 30-90 ms).
pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")


@pytest.fixture(scope="module", autouse=True)
def _collect_left_open_files() -> Iterator[None]:
    yield
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("cli-fuzz")
    samples = {"doc.json": '{"dockind": "CRON_TABLE", "status": "CRON_TABLE_ACTIVE", "props": {"NUM": 1}}',
               "bad.json": "{", "empty.sql": "", "job.sql": "CREATE JOB a.b SCHEDULE EVERY INTERVAL '1 s' "
               "RUN AS r CALL a.p();", "binary": "\x00\xff"}
    out = {"home": str(root / "home")}
    for name, text in samples.items():
        (root / name).write_text(text, encoding="utf-8", errors="surrogateescape")
        out[name] = str(root / name)
    out["missing"] = str(root / "missing.json")
    out["directory"] = str(root)
    return out


def _values(option: click.Parameter, paths: list[str]) -> st.SearchStrategy[str]:
    kind = option.type
    if isinstance(kind, click.Choice):
        return st.sampled_from([*map(str, kind.choices), "bogus", ""])
    if isinstance(kind, click.IntRange | click.FloatRange) or kind in (click.INT, click.FLOAT):
        return st.one_of(st.integers(-(10**12), 10**12).map(str), st.sampled_from(["0", "-1", "1.5", "x", "1e999"]))
    if isinstance(kind, click.File | click.Path):
        return st.sampled_from([*paths, "-"])
    return st.one_of(st.sampled_from(WORDS), ARG_TEXT(12))


@st.composite
def command_lines(draw: st.DrawFn, files: dict[str, str]) -> list[str]:
    """A real command path, then a mix of its own options (good and bad values), flags and junk."""
    path, command = draw(st.sampled_from(COMMANDS))
    paths = [v for k, v in files.items() if k != "home"]
    argv = draw(st.lists(st.sampled_from(["--json", "-v", "-vv"]), max_size=2)) + list(path)
    options = [p for p in command.params if isinstance(p, click.Option)
               and not any(o.startswith(FORBIDDEN) for o in p.opts)]
    for _ in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["option", "option", "argument", "junk"]))
        if kind == "option" and options:
            option = draw(st.sampled_from(options))
            argv.append(draw(st.sampled_from(option.opts)))
            if not option.is_flag:
                argv.append(draw(_values(option, paths)))
        elif kind == "argument":
            argv.append(draw(st.one_of(st.sampled_from(paths), st.sampled_from(WORDS))))
        else:
            argv.append(draw(st.one_of(st.sampled_from(WORDS), ARG_TEXT(10))))
    return argv


def _safe(argv: list[str]) -> bool:
    """Never point at a real server; no NUL byte, which no shell can pass in an argument; and no ``serve``,
    which waits for an unreachable server instead of failing (its arguments: tests/unit/test_config_file.py)."""
    return "serve" not in argv and not any(a.startswith(FORBIDDEN) or "\x00" in a for a in argv)


def run_main(argv: list[str], home: str) -> tuple[int, str, str]:
    """Run the entry point as ``radixjobs ARGV``; (exit code, stdout, stderr). Anything raised but SystemExit
    fails the test: the user would have seen a traceback."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("PG")}
    env |= {"RADIXJOBS_DSN": NOWHERE, "RADIXJOBS_HOME": home}
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved_argv = sys.argv
    code: Any = 0
    with CliRunner().isolation(input="", env=env) as (out, err, _):
        sys.argv = ["radixjobs", *argv]
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        finally:
            sys.argv = saved_argv
            root.handlers[:], root.level = handlers, level
        stdout, stderr = out.getvalue().decode(errors="replace"), err.getvalue().decode(errors="replace")
    assert isinstance(code, int | None), code
    return code or 0, stdout, stderr


def _check(argv: list[str], files: dict[str, str]) -> None:
    if argv[:1] == ["status"] or "status" in argv[:3]:
        argv = [*argv[: argv.index("status") + 1], "--http", "127.0.0.1:9", *argv[argv.index("status") + 1:]]
    code, stdout, stderr = run_main(argv, files["home"])
    assert "Traceback" not in stdout + stderr, (argv, stderr)
    if code in (0, 3):  # success; 3 is `db status`: not running
        return
    assert code in (1, 2, 130), (argv, code, stderr)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, (argv, code, stdout)
    errors = [line for line in lines if line.startswith(("radixjobs: error", "Error: "))]
    if code == 2 and not errors:  # a group without its command: click shows the group's help
        assert lines[0].startswith("Usage: "), (argv, stderr)
        return
    assert len(errors) == 1, (argv, stderr)  # click's usage block around it is fine; one error line


def test_a_file_name_that_is_no_text_is_one_error_line(files: dict[str, str]) -> None:
    """Found by test_command_lines: click opened the file and UnicodeEncodeError escaped as a traceback."""
    code, _, stderr = run_main(["docs", "apply", "\ud800"], files["home"])
    assert code == 2
    assert stderr.strip().startswith("radixjobs: error: an argument is not valid text"), stderr
    _check(["sql", "-f", "\ud800"], files)


@fuzz_settings()
@given(data=st.data())
def test_command_lines(files: dict[str, str], data: st.DataObject) -> None:
    argv = data.draw(command_lines(files))
    assume(_safe(argv))
    _check(argv, files)


@fuzz_settings()
@given(st.lists(st.one_of(st.sampled_from([*WORDS, "db", "docs", "jobs", "sql", "run", "serve", "install"]),
                          ARG_TEXT(15)), max_size=6))
def test_random_words(files: dict[str, str], argv: list[str]) -> None:
    assume(_safe(argv) and not ({"db", "start"} <= set(argv)) and "status" not in argv)
    _check(argv, files)


def test_every_command_refuses_the_unreachable_server_in_one_line(files: dict[str, str]) -> None:
    for path, _ in COMMANDS:
        if path[0] == "db" or path == ("serve",):  # serve waits for an unreachable server (docs/daemon.md)
            continue
        argv = list(path) + ([files["doc.json"]] if path == ("docs", "apply") else [])
        argv += {("jobs", "show"): ["a.b"], ("jobs", "next"): ["a.b"], ("jobs", "history"): ["a.b"],
                 ("jobs", "run"): ["a.b"],
                 ("docs", "show"): ["1"],
                 ("run",): ["--once"], ("docs", "run"): ["--once"], ("sql",): ["-c", "select 1"],
                 ("docs", "grant-service"): ["svc", "PUBLIC"], ("docs", "revoke-service"): ["svc", "PUBLIC"],
                 }.get(path, [])
        code, _, stderr = run_main(argv if path != ("status",) else [*argv, "--http", "127.0.0.1:9"], files["home"])
        assert code == 1, (path, stderr)
        assert stderr.strip().splitlines() == [stderr.strip()], (path, stderr)
        assert stderr.startswith("radixjobs: error: cannot connect to PostgreSQL"), (path, stderr)
