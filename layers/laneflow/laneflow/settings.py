"""The one place laneflow reads its environment (CONVENTIONS: one settings model)."""

from __future__ import annotations

import os
from functools import lru_cache

from pydantic import BaseModel


class Settings(BaseModel):
    """Process-wide settings. Locally the CLI fills most of these from its flags; in Lambda
    they come from the function's environment (template.yaml)."""

    store_url: str | None = None  # LANEFLOW_STORE: sqlite:///PATH or dynamodb://TABLE
    tenant: str = "local"  # LANEFLOW_TENANT
    capture_dir: str | None = None  # LANEFLOW_CAPTURE_DIR (local captures; default beside the store)
    default_model: str = "stub"  # LANEFLOW_MODEL: the model when neither flow nor agent names one
    anthropic_api_key_set: bool = False  # whether ANTHROPIC_API_KEY is present (never its value)
    max_lane_parallel: int = 100  # the most steps of one lane in flight when `parallel:` is unset

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> "Settings":
        env = os.environ if environ is None else environ
        values: dict[str, object] = {"anthropic_api_key_set": bool(env.get("ANTHROPIC_API_KEY"))}
        for field, name in (
            ("store_url", "LANEFLOW_STORE"),
            ("tenant", "LANEFLOW_TENANT"),
            ("capture_dir", "LANEFLOW_CAPTURE_DIR"),
            ("default_model", "LANEFLOW_MODEL"),
            ("max_lane_parallel", "LANEFLOW_MAX_LANE_PARALLEL"),
        ):
            if env.get(name):
                values[field] = env[name]
        return cls.model_validate(values)


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings.from_env()
