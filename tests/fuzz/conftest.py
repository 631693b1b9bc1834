"""Hypothesis profiles of the fuzz campaign: ``ci`` (default) and ``campaign`` (RADIXJOBS_FUZZ_PROFILE)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

from tests.fuzz import PROFILE_VARIABLE, profile_name

_SLOW_IS_FINE = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
                 HealthCheck.function_scoped_fixture]

settings.register_profile("ci", max_examples=150, deadline=None, suppress_health_check=_SLOW_IS_FINE,
                          print_blob=True)
settings.register_profile("campaign", max_examples=10_000, deadline=None, suppress_health_check=_SLOW_IS_FINE,
                          print_blob=True)

if profile_name() not in ("ci", "campaign"):
    raise RuntimeError(f"{PROFILE_VARIABLE} must be 'ci' or 'campaign', not {profile_name()!r}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A campaign target runs for minutes: lift the suite's 300 s per-test timeout for it."""
    if profile_name() == "campaign":
        for item in items:
            if item.nodeid.startswith("tests/fuzz/"):
                item.add_marker(pytest.mark.timeout(3600))
