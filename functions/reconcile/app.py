"""Reconcile (scheduled): settle the journal, interrupt attempts whose worker is gone,
re-drive or close runs whose drive is gone (thin handler)."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.wiring import reconcile_cloud, services


@lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return reconcile_cloud(services()).as_dict()
