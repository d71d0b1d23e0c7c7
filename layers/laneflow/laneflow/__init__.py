"""laneflow: durable, cache-aware flows of AI-agent steps (the domain library)."""

__version__ = "0.1.0"
