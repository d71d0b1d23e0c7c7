"""`output: json`: the JSON of a step's final reply, validated against its schema."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema

from laneflow.domain import jsonsafe
from laneflow.domain.errors import (
    StepFailed,
)
from laneflow.domain.flow import StepSpec
from laneflow.domain.records import (
    FailureKind,
)
from laneflow.ports import StepOutcome

_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


def extract_json(text: str) -> Any:
    """The JSON of a reply: its last fenced block, else the whole text."""
    blocks = _FENCE.findall(text)
    candidate = blocks[-1] if blocks else text
    try:
        return jsonsafe.parse(candidate)  # strictly: a NaN kept in `data` would break the store's reads
    except json.JSONDecodeError as exc:
        raise StepFailed(
            f"the output is not valid JSON ({exc.msg} at line {exc.lineno})", retryable=True, kind=FailureKind.output
        ) from None
    except jsonsafe.Refusal as exc:
        raise StepFailed(f"the output is JSON laneflow cannot keep ({exc})", retryable=True, kind=FailureKind.output) from None


def check_output(spec: StepSpec, outcome: StepOutcome) -> Any:
    """`output: json`: the parsed data, validated against `schema:` when there is one."""
    if spec.output != "json":
        return None
    data = extract_json(outcome.conclusion or outcome.result)
    if spec.schema_:
        validator = jsonschema.validators.validator_for(spec.schema_)(spec.schema_)
        errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
        if errors:
            listed = "; ".join(f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:10])
            raise StepFailed(f"the output does not match its schema: {listed}", retryable=True, kind=FailureKind.output)
    return data
