"""The one place laneflow reads its environment: one settings model, and the few reads
that must see the process's environment as it is now (`environ`, `project_home`).

Every other module is given these (tests/unit/test_settings_env.py holds them to it): a
process's environment is read here and handed on, never looked up where it is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from functools import lru_cache
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, ValidationError, field_validator, model_validator

from laneflow.domain.errors import InvalidInput
from laneflow.domain.tenants import check_tenant
from laneflow.domain.workers import ENGINE_WORKER

# Each setting read from the environment, and the variable it is read from.
ENV_NAMES: tuple[tuple[str, str], ...] = (
    ("anthropic_api_key", "ANTHROPIC_API_KEY"),
    ("anthropic_base_url", "ANTHROPIC_BASE_URL"),
    ("store_url", "LANEFLOW_STORE"),
    ("tenant", "LANEFLOW_TENANT"),
    ("capture_dir", "LANEFLOW_CAPTURE_DIR"),
    ("capture_bucket", "LANEFLOW_CAPTURE_BUCKET"),
    ("default_model", "LANEFLOW_MODEL"),
    ("max_lane_parallel", "LANEFLOW_MAX_LANE_PARALLEL"),
    ("local_drives", "LANEFLOW_LOCAL_DRIVES"),
    ("step_workers", "LANEFLOW_STEP_WORKERS"),
    ("max_drives", "LANEFLOW_MAX_DRIVES"),
    ("reconcile_interval_s", "LANEFLOW_RECONCILE_INTERVAL"),
    ("history_budget", "LANEFLOW_HISTORY_BUDGET"),
    ("on_end_command", "LANEFLOW_ON_END_COMMAND"),
    ("event_bus", "LANEFLOW_EVENT_BUS"),
    ("state_machine_arn", "LANEFLOW_STATE_MACHINE_ARN"),
    ("workspaces", "LANEFLOW_WORKSPACES"),
    ("anthropic_secret", "LANEFLOW_ANTHROPIC_SECRET"),
    ("anthropic_enabled", "LANEFLOW_ANTHROPIC_ENABLED"),
    ("secrets_file", "LANEFLOW_SECRETS_FILE"),
    ("secret_source", "LANEFLOW_SECRET_SOURCE"),
    ("log_level", "POWERTOOLS_LOG_LEVEL"),
    ("isolation", "LANEFLOW_ISOLATION"),
    ("cache_clock", "LANEFLOW_CACHE_CLOCK"),
    ("prefix_registry", "LANEFLOW_PREFIX_REGISTRY"),
    ("ready_siblings", "LANEFLOW_READY_SIBLINGS"),
    ("signin_domain", "LANEFLOW_SIGNIN_DOMAIN"),
    ("signin_client_id", "LANEFLOW_SIGNIN_CLIENT_ID"),
    ("schedule_group", "LANEFLOW_SCHEDULE_GROUP"),
    ("schedule_target", "LANEFLOW_SCHEDULE_TARGET"),
    ("schedule_role", "LANEFLOW_SCHEDULE_ROLE"),
    ("schedule_dead_letter", "LANEFLOW_SCHEDULE_DEAD_LETTER"),
)

# Settings read from the environment that are this process's own, never handed to a child
# by `to_env` (a child inherits what it needs of them with the environment, or is given
# its own: the step workers' LANEFLOW_ENGINE_WORKER).
PROCESS_NAMES: tuple[tuple[str, str], ...] = (
    ("engine_worker", ENGINE_WORKER),
    ("crash_at", "LANEFLOW_CRASH_AT"),
    ("host_lang", "LANG"),
    ("host_tz", "TZ"),
)


class Settings(BaseModel):
    """Process-wide settings. Locally the CLI fills most of these from its flags; in Lambda
    they come from the function's environment (template.yaml)."""

    store_url: str | None = None  # LANEFLOW_STORE: sqlite:///PATH or dynamodb://TABLE
    tenant: str = "local"  # LANEFLOW_TENANT
    capture_dir: str | None = None  # LANEFLOW_CAPTURE_DIR (local captures; default beside the store)
    capture_bucket: str | None = None  # LANEFLOW_CAPTURE_BUCKET: captures in S3 (default: the store's bucket)
    default_model: str = "stub"  # LANEFLOW_MODEL: the model when neither flow nor agent names one
    anthropic_api_key: SecretStr | None = None  # ANTHROPIC_API_KEY (never printed: SecretStr)
    anthropic_base_url: str | None = None  # ANTHROPIC_BASE_URL (a local imitation, a proxy)
    max_lane_parallel: int = 100  # the most steps of one lane in flight when `parallel:` is unset
    local_drives: int = 4  # LANEFLOW_LOCAL_DRIVES: drives `laneflow serve` runs at once (more wait)
    # LANEFLOW_STEP_WORKERS: processes the embedded engine runs its steps (the RunStep function)
    # in, beside the interpreter's own (0: every step in the engine's process).
    step_workers: int = Field(default=0, ge=0, le=32)
    max_drives: int = 5  # LANEFLOW_MAX_DRIVES: reconcile closes a run failed after this many drives
    # LANEFLOW_RECONCILE_INTERVAL: seconds between the reconciles `laneflow serve` runs (after
    # the one at its start), so a run whose worker went away is re-driven without a person.
    reconcile_interval_s: float = Field(default=60.0, gt=0, le=86_400)
    # LANEFLOW_HISTORY_BUDGET: the most history events one execution of a drive records before
    # the drive continues in a fresh one (AWS keeps 25,000; this project allows 20,000).
    history_budget: int = Field(default=18_000, ge=100)
    on_end_command: str | None = None  # LANEFLOW_ON_END_COMMAND: run with "run finished" JSON on stdin
    event_bus: str | None = None  # LANEFLOW_EVENT_BUS: EventBridge bus for "run finished" (cloud)
    state_machine_arn: str | None = None  # LANEFLOW_STATE_MACHINE_ARN: drives start executions of it (cloud)
    workspaces: str | None = None  # LANEFLOW_WORKSPACES: a folder of workspaces, or s3://bucket/prefix
    in_lambda: bool = False  # AWS_LAMBDA_FUNCTION_NAME is set: Powertools logging, tracing, metrics
    anthropic_secret: str | None = (
        None  # LANEFLOW_ANTHROPIC_SECRET: Secrets Manager name of the API key (cloud, step runners only)
    )
    anthropic_enabled: bool = (
        False  # LANEFLOW_ANTHROPIC_ENABLED: the stack holds a key its step runners read (the API accepts Claude runs)
    )
    # LANEFLOW_ISOLATION: where a step's programs run: `auto` (the strongest the machine offers:
    # bubblewrap where it can run) or `subprocess` (a plain child process, never bubblewrap).
    isolation: Literal["auto", "subprocess"] = "auto"
    # The prompt cache's clock ("RATE@EPOCH": RATE times as fast from EPOCH), for benchmarks
    # and tests on the Messages API imitation's fast clock; unset: the wall clock.
    cache_clock: str | None = None
    # The prompt cache across runs (the prefix registry, and leads waiting for another run's
    # writer). On by default; off, runs know nothing of each other's cache, as before it was.
    prefix_registry: bool = True
    # LANEFLOW_READY_SIBLINGS: the embedded engine readies a sibling waiting at its gate (its
    # attempt claimed, its request built), so only its request waits for the lead's reply
    # (adapters/engine/early.py); 0 starts it only once released, as the cloud does.
    ready_siblings: bool = True
    # LANEFLOW_SIGNIN_DOMAIN and LANEFLOW_SIGNIN_CLIENT_ID: the Cognito hosted UI the viewer
    # of `laneflow serve` signs people in at, and its app client (both or neither; unset: no
    # sign-in). In the cloud the people API's stage says it instead (viewer_assets.sign_in).
    signin_domain: str | None = None
    signin_client_id: str | None = None
    # LANEFLOW_SCHEDULE_GROUP, _TARGET, _ROLE, _DEAD_LETTER (cloud): schedules are EventBridge
    # Scheduler schedules in this group, invoking this function (the fire function's ARN) with
    # this role, undeliverable firings kept in this queue. Unset: none (locally `serve` fires).
    schedule_group: str | None = None
    schedule_target: str | None = None
    schedule_role: str | None = None
    schedule_dead_letter: str | None = None
    secrets_file: str | None = None  # LANEFLOW_SECRETS_FILE (`--secrets FILE`): declared secrets, dotenv (local)
    secret_source: Literal["local", "secretsmanager"] = "local"  # LANEFLOW_SECRET_SOURCE: where declared secrets are read
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] | None = None  # POWERTOOLS_LOG_LEVEL
    # LANEFLOW_ENGINE_WORKER: set in a step worker of the embedded engine, the engine's process
    # (a LocalProcess as JSON), whose attempts it runs as the engine's own.
    engine_worker: str | None = None
    # LANEFLOW_CRASH_AT: `NAME` or `NAME:K`, the crash-injection suite's point at which this
    # process kills itself (the K-th time it is reached); unset everywhere else.
    crash_at: str | None = None
    host_lang: str | None = None  # LANG: what a step's programs get, when set (else C.UTF-8)
    host_tz: str | None = None  # TZ: likewise (else UTC)

    @field_validator("log_level", mode="before")
    @classmethod
    def _level_name(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("tenant")
    @classmethod
    def _tenant_is_valid(cls, tenant: str) -> str:
        return check_tenant(tenant)  # TenantInvalid (bad input), never a pydantic error

    @field_validator("cache_clock")
    @classmethod
    def _clock_is_valid(cls, spec: str | None) -> str | None:
        from laneflow.domain.cache import clock_of

        clock_of(spec)  # a ValueError naming the variable
        return spec or None

    @field_validator("signin_domain")
    @classmethod
    def _domain_is_an_origin(cls, domain: str | None) -> str | None:
        return signin_origin(domain) if domain else None

    @field_validator("signin_client_id")
    @classmethod
    def _client_is_an_id(cls, client_id: str | None) -> str | None:
        return check_client_id(client_id) if client_id else None

    @model_validator(mode="after")
    def _signin_is_whole(self) -> Settings:
        if bool(self.signin_domain) != bool(self.signin_client_id):
            raise ValueError("LANEFLOW_SIGNIN_DOMAIN and LANEFLOW_SIGNIN_CLIENT_ID are given together, or neither")
        return self

    @property
    def anthropic_api_key_set(self) -> bool:
        return bool(self.anthropic_api_key and self.anthropic_api_key.get_secret_value())

    @property
    def step_workers_given(self) -> bool:
        """Whether the step workers were set (LANEFLOW_STEP_WORKERS, or by whoever made these
        settings), not left at their default."""
        return "step_workers" in self.model_fields_set

    @property
    def claude_configured(self) -> bool:
        """Whether this deployment can call a Claude model: a key given, or one it reads
        (Secrets Manager's name, or the stack saying its step runners hold one)."""
        return self.anthropic_api_key_set or bool(self.anthropic_secret) or self.anthropic_enabled

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {"in_lambda": bool(env.get("AWS_LAMBDA_FUNCTION_NAME"))}
        for field, name in ENV_NAMES + PROCESS_NAMES:
            if env.get(name):
                values[field] = env[name]
        if "tenant" in values:
            check_tenant(values["tenant"], source="LANEFLOW_TENANT")
        try:
            return cls.model_validate(values)
        except ValidationError as error:
            raise InvalidInput(unusable_variables(error)) from None

    def to_env(self) -> dict[str, str]:
        """The variables `from_env` reads these settings back from (those set): what a child
        process of laneflow's own (a local sandbox worker) is given, whatever this process
        was configured with (flags or variables)."""
        out = {}
        for field, name in ENV_NAMES:
            value = getattr(self, field)
            if isinstance(value, SecretStr):
                value = value.get_secret_value()
            if value is None or value == "":
                continue
            if isinstance(value, bool) and value == type(self).model_fields[field].default:
                continue  # a switch at its default needs no variable (one on by default is told when off)
            out[name] = str(value).lower() if isinstance(value, bool) else str(value)
        return out


_CLIENT_ID = re.compile(r"[A-Za-z0-9]{1,128}")
_HOST = re.compile(r"[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?")
_LOOPBACK = {"127.0.0.1", "localhost"}
_NOT_A_DOMAIN = "a sign-in domain is a host name (auth.example.com) or an origin (https://HOST[:PORT])"


def signin_origin(domain: str) -> str:
    """The origin of a Cognito hosted UI, from its domain as given: `auth.example.com` or
    `PREFIX.auth.REGION.amazoncognito.com` (https), or a whole origin; plain http only on
    this machine (a local imitation of the hosted UI). A ValueError says what is wrong (not
    what was given: the messages are said back by variable name)."""
    given = domain.strip()
    parts = urlsplit(given if "://" in given else "https://" + given)
    host = parts.hostname or ""
    if parts.scheme != "https" and not (parts.scheme == "http" and host in _LOOPBACK):
        raise ValueError("a sign-in domain is https (plain http only on 127.0.0.1 or localhost)")
    try:
        port = parts.port
    except ValueError:  # not a number, or past 65535
        raise ValueError(_NOT_A_DOMAIN) from None
    if not _HOST.fullmatch(host) or "@" in parts.netloc or parts.path.strip("/") or parts.query or parts.fragment:
        raise ValueError(_NOT_A_DOMAIN)
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def check_client_id(client_id: str) -> str:
    """A Cognito app client id, or a ValueError."""
    if not _CLIENT_ID.fullmatch(client_id):
        raise ValueError("an app client id is letters and digits")
    return client_id


def unusable_variables(error: ValidationError) -> str:
    """What is wrong with the environment, by the variables' names (never their values: one
    may be a key)."""
    names = dict(ENV_NAMES + PROCESS_NAMES)
    said = [
        f"{names.get(str(e['loc'][0]), str(e['loc'][0])) if e['loc'] else 'the environment'}: {e['msg']}" for e in error.errors()
    ]
    return "; ".join(said)


@lru_cache(maxsize=1)
def settings() -> Settings:
    return Settings.from_env()


def environ() -> Mapping[str, str]:
    """This process's environment, whole and as it is now: for the few that need the mapping
    itself, not settings read from it: the environment a child process of laneflow's own
    inherits, the declared secrets read from it (locally, when no file holds them), whether
    the terminal wants plain lines (NO_COLOR, TERM), whether glibc was given its arenas
    (MALLOC_ARENA_MAX)."""
    return os.environ


def project_home() -> str | None:
    """LANEFLOW_HOME: the folder holding the project's files (template.yaml), when set. Read
    as it is now, not through `settings()`: the project's files are found before any
    settings are, and a setting that cannot be used must not hide them."""
    return os.environ.get("LANEFLOW_HOME") or None
