"""The environment's settings, given anything: read, or refused with `InvalidInput` naming
the variables that cannot be used; never another exception (a traceback at start-up)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from laneflow.domain.errors import InvalidInput
from laneflow.settings import ENV_NAMES, Settings

VARIABLES = [name for _, name in ENV_NAMES]


@given(st.dictionaries(st.sampled_from(VARIABLES), st.text(max_size=12), max_size=4))
def test_any_environment_reads_or_is_refused_naming_its_variables(environ: Any) -> None:
    try:
        cfg = Settings.from_env(environ)
    except InvalidInput as refused:
        said = str(refused)
        assert said and any(name in said for name in environ), said
        return
    assert cfg.history_budget >= 100 and 0 <= cfg.step_workers <= 32
