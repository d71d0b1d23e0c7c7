"""Api: the HTTP API behind API Gateway (thin handler: the event goes to the one resolver,
laneflow/entrypoints/api/, over this container's services)."""

from typing import Any

from aws_lambda_powertools.utilities.typing import LambdaContext

from laneflow.entrypoints.api import resolve
from laneflow.entrypoints.lambda_handler import lambda_handler
from laneflow.wiring import services


@lambda_handler
def handler(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return resolve(event, context, services())
