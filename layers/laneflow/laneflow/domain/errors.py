"""Domain errors. Their class names are an API: the state machine retries and catches by
these names, the HTTP API maps them to status codes in one place, and the CLI prints them
as one line with a non-zero exit."""

from __future__ import annotations

from pydantic import BaseModel

from laneflow.domain.records import FailureKind


class Problem(BaseModel):
    """One thing wrong with a workspace, flow or input: where, and what."""

    file: str  # relative to the workspace (or the account folder), never an absolute path
    line: int | None = None
    field: str | None = None
    message: str
    severity: str = "error"  # error | warning

    def __str__(self) -> str:
        where = self.file + (f":{self.line}" if self.line else "")
        field = f" {self.field}:" if self.field else ""
        tag = "" if self.severity == "error" else f"{self.severity}: "
        return f"{where}:{field} {tag}{self.message}"


class LaneflowError(Exception):
    """Base of every error laneflow raises on purpose."""

    exit_code = 1
    http_status = 500


class InvalidInput(LaneflowError):
    """Bad input from a person: a workspace, flow or run input that cannot be used.

    Carries every problem found, so a person can fix them all in one go."""

    exit_code = 2
    http_status = 400

    def __init__(self, message: str, problems: list[Problem] | None = None):
        self.problems = problems or []
        super().__init__(message)

    def __str__(self) -> str:
        head = super().__str__()
        if not self.problems:
            return head
        return head + "\n" + "\n".join(f"  {p}" for p in self.problems)

    def one_line(self) -> str:
        """The message and its first problem (file, line, field) on one line, for a
        record's `error` or a reason, where a list does not fit."""
        head = str(self.args[0]) if self.args else type(self).__name__
        errors = [p for p in self.problems if p.severity == "error"] or self.problems
        if not errors or str(errors[0]) in head:
            return head
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return f"{head}: {errors[0]}{more}"


class WorkspaceInvalid(InvalidInput):
    """A workspace that cannot be read (missing, or a file that does not parse)."""


class FlowInvalid(InvalidInput):
    """A flow that is not valid; refused before the run starts."""


class RunInputInvalid(InvalidInput):
    """A run input that does not match the flow's `input:` schema."""


class NotFound(LaneflowError):
    exit_code = 2
    http_status = 404


class RunNotFound(NotFound):
    def __init__(self, run_id: str):
        super().__init__(f"no run {run_id!r}")
        self.run_id = run_id


class RecordDamaged(LaneflowError):
    """A stored record that cannot be read back: it holds what no entrance lets in now (a
    NaN written before such values were refused, a hand edit). Other records read on: a
    list leaves it out, reconcile goes on with the rest, and reading it says which record
    and which field."""


class Conflict(LaneflowError):
    """A conditional write was refused: what it was conditional on no longer holds."""

    http_status = 409


class AttemptEnded(Conflict):
    """A write named an attempt that is no longer the stored, running one."""


class IdempotencyKeyReused(Conflict):
    """An idempotency key was presented again with a different request."""


class Unavailable(LaneflowError):
    """This deployment lacks what the request needs (a drive starter, a workspace source)."""

    http_status = 503


class StepFailed(LaneflowError):
    """A step attempt failed. `retryable` says whether it was not the step's own fault
    (model or network error, invalid output), so another attempt may be made. `kind` says
    what failed, for the next attempt's message: a retryable failure is a model or network
    error unless said otherwise (`FailureKind.output` for a refused output)."""

    def __init__(self, reason: str, *, retryable: bool = True, kind: FailureKind | None = None):
        super().__init__(reason)
        self.reason = reason
        self.retryable = retryable
        self.kind = kind or (FailureKind.model if retryable else FailureKind.other)


class StepStopped(StepFailed):
    """The run was stopped by a person while this attempt ran: it ends, and says so."""

    def __init__(self, reason: str = "stopped by a person"):
        super().__init__(reason, retryable=False)


class TransientError(LaneflowError):
    """An infrastructure error worth retrying the whole Task for (the state machine retries
    it by name)."""


class ModelNotConfigured(InvalidInput):
    """A non-stub model was asked for without what it needs (an API key)."""


class WorkspaceNotFound(NotFound):
    def __init__(self, name: str):
        super().__init__(f"no workspace {name!r}")
