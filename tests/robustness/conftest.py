"""Hostile-input tests: property-based (Hypothesis) tests of every entrance.

One profile for all of them, chosen so the whole folder runs in well under a minute on a
busy 2-core machine: a fixed number of examples, derandomized (the same examples on every
run, so a failure is reproducible and CI does not turn red by chance), no example database
written into the checkout. `HYPOTHESIS_PROFILE=thorough` runs many more, randomized, to
look for new failures by hand.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "robustness",
    max_examples=300,
    deadline=None,  # a busy machine's pauses are not failures
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
)
settings.register_profile("thorough", parent=settings.get_profile("robustness"), max_examples=2000, derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "robustness"))
