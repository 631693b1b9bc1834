"""Property-based and mutation fuzzing of every input radixjobs takes from users (hypothesis).

The number of examples comes from a settings profile registered in ``conftest.py``: ``ci`` (the default,
small enough that ``pytest tests/fuzz`` takes well under a minute) or ``campaign`` (10,000+ examples per
target), chosen with ``RADIXJOBS_FUZZ_PROFILE=campaign``. Targets that talk to PostgreSQL use
:func:`database_settings`, a tenth of that.
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILE_VARIABLE = "RADIXJOBS_FUZZ_PROFILE"


def profile_name() -> str:
    return os.environ.get(PROFILE_VARIABLE, "ci")


def fuzz_settings() -> settings:
    """The active profile, as a decorator for a pure (in-process) target."""
    return settings.get_profile(profile_name())


def database_settings() -> settings:
    """The active profile with a tenth of its examples, for targets that write to PostgreSQL."""
    active = fuzz_settings()
    return settings(active, max_examples=max(10, active.max_examples // 10))
