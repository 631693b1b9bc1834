"""--config FILE: keys, types, precedence (command line > file > environment > defaults), one-line errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from radixjobs.cli import cli
from radixjobs.config_file import ConfigFileCommand, config_option, keys_of


@click.group()
@click.option("--dsn", envvar="T_DSN", default=None)
@click.pass_context
def group(ctx: click.Context, dsn: str | None) -> None:
    ctx.obj = dsn


@group.command("serve", cls=ConfigFileCommand)
@config_option
@click.option("--dsn", envvar="T_DSN", default=None)
@click.option("--http", default="127.0.0.1:7317")
@click.option("--per-database-concurrency", type=click.IntRange(1, 1024), default=8, envvar="T_PDC")
@click.option("--poll", type=click.FloatRange(min=0.01), default=1.0)
@click.option("--all-databases", is_flag=True)
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text")
@click.option("--service", "services", multiple=True)
@click.pass_context
def serve(ctx: click.Context, **params: Any) -> None:
    params["parent_dsn"] = ctx.obj
    click.echo(json.dumps(params))


def run(tmp_path: Path, toml: str | None, *args: str, env: dict[str, str] | None = None,
        ) -> tuple[int, dict[str, Any] | str]:
    extra: list[str] = []
    if toml is not None:
        path = tmp_path / "radixjobs.toml"
        path.write_text(toml, encoding="utf-8")
        extra = ["--config", str(path)]
    before = [a for a in args if a.startswith("@")]
    result = CliRunner().invoke(group, [*(a[1:] for a in before), "serve", *extra,
                                        *(a for a in args if not a.startswith("@"))], env=env or {})
    if result.exit_code == 0:
        return 0, json.loads(result.output)
    return result.exit_code, result.output.strip().splitlines()[-1]


def test_every_kind_of_key(tmp_path: Path) -> None:
    code, params = run(tmp_path, 'dsn = ["host=/a"]\nhttp = "127.0.0.1:9"\nper-database-concurrency = 3\n'
                                 'poll = 2\nall-databases = true\nlog-format = "json"\nservice = ["a=m:f", "b=m:g"]\n')
    assert code == 0
    assert params == {"dsn": "host=/a", "http": "127.0.0.1:9", "per_database_concurrency": 3, "poll": 2.0,
                      "all_databases": True, "log_format": "json", "services": ["a=m:f", "b=m:g"],
                      "parent_dsn": None}


def test_precedence_command_line_file_environment_default(tmp_path: Path) -> None:
    toml = "per-database-concurrency = 5\ndsn = 'host=/file'\n"
    env = {"T_PDC": "6", "T_DSN": "host=/env"}
    assert run(tmp_path, None)[1]["per_database_concurrency"] == 8  # type: ignore[index]
    assert run(tmp_path, None, env=env)[1]["per_database_concurrency"] == 6  # type: ignore[index]
    assert run(tmp_path, toml, env=env)[1]["per_database_concurrency"] == 5  # type: ignore[index]
    assert run(tmp_path, toml, "--per-database-concurrency", "7", env=env)[1]["per_database_concurrency"] == 7  # type: ignore[index]
    assert run(tmp_path, toml, env=env)[1]["dsn"] == "host=/file"  # type: ignore[index]
    assert run(tmp_path, toml, "--dsn", "host=/cli", env=env)[1]["dsn"] == "host=/cli"  # type: ignore[index]
    # a flag before the command name is the command line too: the file's value gives way
    _, params = run(tmp_path, toml, "@--dsn", "@host=/before", env=env)
    assert params["dsn"] is None  # type: ignore[index]
    assert params["parent_dsn"] == "host=/before"  # type: ignore[index]
    # the command line replaces a file's list, it does not add to it
    _, params = run(tmp_path, "service = ['a=m:f']", "--service", "b=m:g")
    assert params["services"] == ["b=m:g"]  # type: ignore[index]


@pytest.mark.parametrize(("toml", "message"), [
    ("nope = 1", "unknown key 'nope'; the keys are the long flags of `group serve` without the dashes"),
    ("per_database_concurrency = 2", "unknown key 'per_database_concurrency' (did you mean "
                                     "'per-database-concurrency'?); the keys are the long flags of `group serve` "
                                     "without the dashes"),
    ("per-database-concurrency = '2'", "key 'per-database-concurrency': expected an integer, got a string"),
    ("per-database-concurrency = true", "key 'per-database-concurrency': expected an integer, got true/false"),
    ("per-database-concurrency = 0", "key 'per-database-concurrency': 0 is not in the range 1<=x<=1024."),
    ("poll = 'fast'", "key 'poll': expected a number, got a string"),
    ("all-databases = 'yes'", "key 'all-databases': expected true or false, got a string"),
    ("log-format = 'xml'", "key 'log-format': 'xml' is not one of 'text', 'json'."),
    ("dsn = ['host=/a', 'host=/b']", "key 'dsn': takes one value; a list of 2 is not supported"),
    ("service = [1]", "key 'service': expected a string, got an integer"),
    ("[serve]\npoll = 1", "unknown key 'serve'; the keys are the long flags of `group serve` without the dashes"),
    ("http = {a = 1}", "key 'http': expected a string, got a table"),
    ("poll = 1\nhttp = = 2\n", "invalid TOML: Invalid value (at line 2, column 8)"),
])
def test_problems_are_one_line_naming_the_key(tmp_path: Path, toml: str, message: str) -> None:
    code, text = run(tmp_path, toml)
    assert code == 2
    line = "" if message.startswith("invalid TOML") else ", line 1"
    assert text == f"Error: config file {tmp_path / 'radixjobs.toml'}{line}: " + message


def test_a_misspelt_key_gets_the_nearest_one_and_its_line(tmp_path: Path) -> None:
    code, text = run(tmp_path, "# the daemon\npoll = 2\n\nper-database-concurency = 4\n")
    assert code == 2
    assert text == (f"Error: config file {tmp_path / 'radixjobs.toml'}, line 4: unknown key "
                    "'per-database-concurency' (did you mean 'per-database-concurrency'?); the keys are the long "
                    "flags of `group serve` without the dashes")
    _, far = run(tmp_path, "zzz = 1")
    assert "did you mean" not in far


def test_serve_reports_a_bad_value_from_the_file_as_its_key(tmp_path: Path) -> None:
    path = tmp_path / "radixjobs.toml"
    path.write_text('log-format = "json"\nhttp = "no-port-here"\n', encoding="utf-8")
    result = CliRunner().invoke(cli, ["serve", "--config", str(path)])
    assert result.exit_code == 2
    last = result.output.strip().splitlines()[-1]
    assert last.startswith(f"Error: config file {path}, line 2: key 'http': "), last
    assert "--http" not in last
    flag = CliRunner().invoke(cli, ["serve", "--http", "no-port-here"])
    assert flag.exit_code == 2
    assert "Invalid value for --http: expected HOST:PORT or off" in flag.output
    typo = tmp_path / "typo.toml"
    typo.write_text("conurrency = 4\n", encoding="utf-8")
    misspelt = CliRunner().invoke(cli, ["serve", "--config", str(typo)])
    assert "unknown key 'conurrency' (did you mean 'concurrency'?)" in misspelt.output


def test_unreadable_file(tmp_path: Path) -> None:
    result = CliRunner().invoke(group, ["serve", "--config", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2
    assert "cannot read it: No such file or directory" in result.output
    assert "Traceback" not in result.output


def test_serve_has_a_key_for_every_flag() -> None:
    serve_command = cli.commands["serve"]
    keys = set(keys_of(serve_command))
    long_flags = {opt[2:] for p in serve_command.params for opt in p.opts[:1] if opt.startswith("--")}
    assert keys == long_flags - {"config"}
    assert {"dsn", "http", "per-database-concurrency", "service", "max-per-principal", "home"} <= keys


def test_the_shipped_example_is_valid() -> None:
    from radixjobs.config_file import load

    serve_command = cli.commands["serve"]
    example = Path(__file__).resolve().parents[2] / "contrib" / "radixjobs.toml"
    with click.Context(serve_command, info_name="serve") as ctx:
        values = load(ctx, serve_command, example).values
    assert values["dsn"] == ("host=/run/postgresql dbname=app user=radixjobs",)  # serve: one or several
    assert values["services"] == ()
    assert values["log_format"] == "json"


def test_the_documented_example_is_valid(tmp_path: Path) -> None:
    from radixjobs.config_file import load

    text = (Path(__file__).resolve().parents[2] / "docs" / "daemon.md").read_text(encoding="utf-8")
    example = text.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "example.toml"
    path.write_text(example, encoding="utf-8")
    serve_command = cli.commands["serve"]
    with click.Context(serve_command, info_name="serve") as ctx:
        values = load(ctx, serve_command, path).values
    # every flag of this version (flags added later should join the example)
    assert {"dsn", "all_databases", "http", "http_max_connections", "http_request_timeout", "http_allowed_hosts",
            "node_id",
            "concurrency", "per_database_concurrency", "max_per_principal", "grace", "poll", "discovery_interval",
            "log_format", "services", "home"} <= set(values)



def test_several_dsns_from_the_file_and_the_command_line_wins(tmp_path: Path) -> None:
    """``serve``'s decorators on a command of the real root group: ``dsn = [a, b]`` is two targets; ``--dsn``
    given after or before the command name wins; the environment is one DSN, never split."""
    from radixjobs.cli.common import Options, many_dsns_options

    seen: list[tuple[str, ...]] = []

    @click.command("t-serve", cls=ConfigFileCommand)
    @config_option
    @many_dsns_options
    def t_serve(opts: Options) -> None:
        seen.append(opts.dsns)

    path = tmp_path / "radixjobs.toml"
    path.write_text('dsn = ["host=/a dbname=x", "host=/b dbname=x"]\n', encoding="utf-8")
    cli.add_command(t_serve)
    try:
        for args in (["t-serve", "--config", str(path)], ["t-serve", "--config", str(path), "--dsn", "host=/c",
                                                          "--dsn", "host=/e"],
                     ["--dsn", "host=/d", "t-serve", "--config", str(path)], ["t-serve"]):
            result = CliRunner().invoke(cli, args, env={"RADIXJOBS_DSN": "host=/env dbname=y"})
            assert result.exit_code == 0, result.output
    finally:
        cli.commands.pop("t-serve")
    assert seen == [("host=/a dbname=x", "host=/b dbname=x"), ("host=/c", "host=/e"), ("host=/d",),
                    ("host=/env dbname=y",)]
