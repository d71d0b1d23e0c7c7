"""The HTTP API: one Powertools resolver, the same routes behind API Gateway
(functions/api/app.py) and behind `laneflow serve` (entrypoints/serve.py).

- `routes`: the routes, each reading its request and calling one use case; the tenant
  always comes from the caller's identity, never from a body.
- `errors`: the one mapping of errors to status codes.
- `viewer/`: the run viewer's page, script and style, served as one page by `/`.
"""

from laneflow.entrypoints.api.errors import GENERIC_ERROR
from laneflow.entrypoints.api.routes import app, resolve
from laneflow.usecases.start_run_idempotent import idempotent_run_id

__all__ = ["GENERIC_ERROR", "app", "idempotent_run_id", "resolve"]
