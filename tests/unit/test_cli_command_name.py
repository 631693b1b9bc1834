"""The command the start banner suggests is one that runs this radixjobs from the same shell."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from radixjobs.cli import common


@pytest.fixture
def script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / ".venv" / "bin" / "radixjobs"
    path.parent.mkdir(parents=True)
    path.write_text("#!/bin/sh\n", encoding="utf-8")
    path.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    return path


def test_the_name_alone_when_the_path_finds_this_program(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}/usr/bin")
    assert common.command_name() == "radixjobs"


def test_the_path_it_was_started_by_when_not_on_the_path(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(sys, "argv", [".venv/bin/radixjobs"])
    assert common.command_name() == ".venv/bin/radixjobs"  # after `make run`
    monkeypatch.setattr(sys, "argv", [str(script)])
    assert common.command_name() == ".venv/bin/radixjobs"  # below the working directory: as typed there
    elsewhere = script.parents[2] / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert common.command_name() == str(script)


def test_python_dash_m_when_started_as_a_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/somewhere/radixjobs/__main__.py"])
    assert common.command_name().endswith(" -m radixjobs")
