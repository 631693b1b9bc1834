"""serve --event-loop: asyncio's own loop by default, uvloop's when asked for."""

from __future__ import annotations

import asyncio
import importlib.util

import click
import pytest

from radixjobs.cli.serve import _loop_factory

HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


def test_asyncio_is_asyncio_s_own_loop() -> None:
    assert _loop_factory("asyncio") is None


def test_uvloop_runs_a_coroutine_or_says_it_is_missing() -> None:
    if not HAVE_UVLOOP:
        with pytest.raises(click.BadParameter, match="uvloop is not installed"):
            _loop_factory("uvloop")
        return
    with asyncio.Runner(loop_factory=_loop_factory("uvloop")) as runner:
        loop = runner.run(_running_loop())
    assert type(loop).__module__.startswith("uvloop")


async def _running_loop() -> asyncio.AbstractEventLoop:
    await asyncio.sleep(0)
    return asyncio.get_running_loop()
