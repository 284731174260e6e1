"""Process settings, from ``ARTSVC_*`` environment variables or a ``.env`` file."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.spec import RewardSpec

if TYPE_CHECKING:
    from judges.graders import CodeGraders


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ARTSVC_", env_file=".env", extra="ignore")

    data_dir: Path = Field(
        Path(".artsvc"),
        validate_default=True,  # the default is relative too: it must become absolute like any given value
        description="Checkpoints, caches and the default SQLite database live here (made absolute when read).",
    )
    database_url: str | None = Field(
        None, description="SQLAlchemy URL of the store; default: a SQLite file artsvc.db in data_dir."
    )
    lease_seconds: int = Field(60, gt=0, description="How long a worker's claim on a job lasts without a heartbeat.")

    host: str = Field("127.0.0.1", description="Address `artsvc serve` binds.")
    port: int = Field(8000, ge=0, le=65535, description="Port `artsvc serve` binds (0: any free port).")
    local_mode: bool = Field(
        False, description="Single-user mode: no tokens, every request acts as the operator. Refused beyond loopback."
    )
    trusted_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names the API answers besides the loopback ones (127.0.0.1, localhost, [::1]), "
        "comma-separated, '*.example.com' for its subdomains; a request naming another Host gets 400. Local mode "
        "answers only these and loopback; otherwise, unset: any Host.",
    )
    api_url: str = Field("http://127.0.0.1:8000", description="Where `artsvc submit` and `artsvc watch` find the API.")
    token: str | None = Field(None, description="Bearer token `artsvc submit` and `artsvc watch` send.")
    max_body_bytes: int = Field(64 * 1024, gt=0, description="Largest request body the API accepts (413 beyond).")
    client_batch_max_bytes: int = Field(
        64 * 1024 * 1024, ge=1024, le=1024**3, description="Largest body of POST /v1/preview/training-jobs (ART's "
        "client posts a step's trajectory groups in one body), read to disk as it arrives (413 beyond)."
    )
    client_batch_max_trajectories: int = Field(
        4096, ge=1, le=100_000, description="Most trajectories in one batch ART's client posts (422 beyond)."
    )
    client_max_sequence_tokens: int = Field(
        8192, ge=256, le=131_072, description="Longest trajectory, in tokens, that a client's batch may train on: a "
        "training row holds a whole trajectory, and its cost grows with the square (the batch fails beyond)."
    )

    api_processes: int = Field(
        1,
        ge=1,
        le=64,
        description="Processes `artsvc serve` answers requests with, on one socket (above 1 it supervises them as "
        "children, starting again one that dies). The connection pool and the request and stream caps below are each "
        "process's, and so is a checkpoint loaded for chat completions.",
    )
    workers: int = Field(
        1, ge=0, le=64, description="Worker processes `artsvc serve` starts, and starts again when one dies (0: none)."
    )
    worker_cpu_policy: Literal["idle", "nice"] = Field(
        "idle",
        description="How `artsvc serve`'s workers yield the CPU to the API, so requests stay fast while jobs train: "
        "`idle`, Linux's SCHED_IDLE (only CPU time nothing else wants; a request preempts them at once; elsewhere as "
        "`nice`); `nice`, a niceness `worker_nice` higher (shares by weight).",
    )
    worker_nice: int = Field(
        10,
        ge=0,
        le=19,
        description="CPU niceness `artsvc serve` adds to its workers under `worker_cpu_policy` `nice` "
        "(0: the API's priority).",
    )
    worker_grace_s: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="How long `artsvc serve` waits on shutdown for its workers to finish or "
        "checkpoint their current step before it kills them.",
    )
    worker_concurrency: int = Field(1, gt=0, le=64, description="Jobs one worker trains at once.")
    precision: Literal["auto", "bfloat16", "float32"] = Field(
        "auto", description="The dtype the transformers backend (and the inference process) holds a base model in; "
        "LoRA weights and their optimizer state stay float32. `auto`: bfloat16 on CUDA and on CPUs that multiply it "
        "natively (AMX-BF16, AVX512-BF16), float32 on others (AVX2 only emulates it, slower). Manifests lock it: runs "
        "measured in different precisions are not compared.",
    )
    activation_memory_gib: float | None = Field(None, ge=0, le=4096, description="GiB of activations a training pass "
        "keeps instead of recomputing them, by layer; unset: 0.5 in bf16, 0 in float32 (activation_memory.py).")
    poll_seconds: float = Field(1.0, gt=0, description="How often an idle worker looks for queued jobs (a job queued "
                                "wakes it at once: service/store/queue_signal.py).")
    trajectories_per_step: int = Field(8, ge=0, le=1024, description="Rollouts kept per step for operators to read.")
    alert_webhook_url: str | None = Field(None, description="Alerts are POSTed here as JSON, with retries.")

    # Judges are the operator's to configure: a job names one of judge_models, never an endpoint or a key.
    judge_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Judge models jobs may name, comma-separated litellm names (e.g. openai/gpt-4o-mini); none: no judged jobs.",
    )
    judge_api_base: str | None = Field(
        None,
        description="OpenAI-compatible endpoint of the judges; unset, litellm's provider variables (OPENAI_BASE_URL...).",
    )
    judge_api_key: SecretStr | None = Field(None, description="Key for judge_api_base; unset, the provider's variable.")
    judge_timeout_s: float = Field(60.0, gt=0, le=3600, description="Seconds one judge call may take before a retry.")
    judge_max_retries: int = Field(4, ge=0, le=20, description="Retries of a judge call (timeout, 429, 5xx, bad JSON).")
    judge_concurrency: int = Field(4, gt=0, le=256, description="Judge calls one job may have out at once.")
    judge_backoff_s: float = Field(1.0, ge=0, le=60, description="First wait before retrying a judge call; it doubles.")
    judge_exact_verdicts: bool = Field(False, description="Ask RULER judges for the exact schema of a usable verdict "
                                       "(ids 1..n once each, scores on a 0.01 grid), for an endpoint that holds "
                                       "replies to a JSON schema (this server's /v1, vLLM; not OpenAI's strict mode).")
    served_base_models: Annotated[list[str], NoDecode] = Field(default_factory=list, description="Base models any "
        "token may sample from at POST /v1/chat/completions (a local judge), comma-separated `NAME` (as a job names a "
        "base model) or `NAME=SOURCE` (a model directory or .gguf file served as NAME).")  # fmt: skip
    # Baselines likewise: an evaluation or a job's baseline names one of baseline_models.
    baseline_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Models evaluations and jobs' baselines may name, comma-separated litellm provider/model names.",
    )
    baseline_api_base: str | None = Field(
        None, description="OpenAI-compatible endpoint serving the baseline models; unset, the provider's own (litellm)."
    )
    baseline_api_key: SecretStr | None = Field(
        None, description="Key for baseline_api_base; unset, the provider's variable."
    )

    # Tenants (issue 13): what one client token may ask of this server. Operators' tokens are bound only by the
    # per-job limits. Each refusal is a 429 or 422 naming the setting.
    tenant_max_queued_jobs: int = Field(
        20,
        ge=0,
        le=100_000,
        description="Queued jobs and evaluations one client may have waiting at once (429 beyond).",
    )
    tenant_max_running_jobs: int = Field(
        2, ge=1, le=10_000, description="Jobs of one client that workers run at once; the rest wait in the queue."
    )
    max_steps_per_job: int = Field(
        10_000, ge=1, le=100_000, description="Largest training.max_steps a job may ask for."
    )
    max_rollouts_per_job: int = Field(
        2_000_000, ge=1, le=10**9, description="Largest max_steps x groups_per_step x group_size a job may ask for."
    )
    max_rollouts_per_step: int = Field(
        1024,
        ge=2,
        le=262_144,
        description="Largest groups_per_step x group_size a job may ask for: the rollouts one training step holds "
        "in memory and gathers at once.",
    )
    max_warm_start_examples: int = Field(
        100_000,
        ge=0,
        le=10_000_000,
        description="Most demonstrations one warm start may train on (training.warm_start_examples, or the "
        "environment's recommendation when unset; math's is 51,200 on the embedded backend).",
    )
    max_validation_examples: int = Field(
        1_000, ge=1, le=100_000, description="Largest validation.max_examples a job may ask for (rolled out twice per "
        "validation: sampled and greedy)."
    )
    client_backends: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["transformers", "embedded"],
        description="Backends client tokens may name, comma-separated (serverless spends the operator's credentials).",
    )
    client_base_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Base models client tokens may name beyond the environment's default, comma-separated; '*': any.",
    )
    max_attempts: int = Field(
        3,
        ge=1,
        le=100,
        description="Claims of one job before it fails: a job that kills its worker is not retried forever.",
    )

    # Code graders run only what the operator registered (entry-point group artsvc.graders, or this list).
    grader_functions: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="'module:function' python graders jobs may name, comma-separated, besides the artsvc.graders entry points.",
    )
    grader_memory_mb: int = Field(
        512, ge=64, le=65_536, description="Address-space limit of one python-grader process."
    )
    grader_processes: int = Field(4, ge=1, le=64, description="Python-grader processes one worker runs at once.")

    # Connections and overload: the pool, the request threads and the streams are sized together.
    db_pool_size: int = Field(10, ge=1, le=1_000, description="Database connections one API process keeps open.")
    db_max_overflow: int = Field(10, ge=0, le=1_000, description="Connections the API may open beyond db_pool_size.")
    db_pool_timeout_s: float = Field(
        2.0, gt=0, le=60, description="Longest wait for a free connection before the request is answered 503."
    )
    max_concurrent_requests: int = Field(
        64, ge=1, le=10_000, description="Requests one API process works on at once; beyond, 503 with Retry-After at once."
    )
    max_concurrent_requests_per_caller: int = Field(
        16,
        ge=1,
        le=10_000,
        description="Requests one token (its bearer header in any spelling, and its dashboard sessions) may have in "
        "progress in one API process at once (429 beyond), so one tenant's flood leaves the rest of "
        "max_concurrent_requests to the others.",
    )
    max_concurrent_unauthenticated_requests: int = Field(
        8,
        ge=1,
        le=10_000,
        description="Requests without a valid credential (none, malformed, unknown or revoked) in progress in one API "
        "process at once, all of them together (503 beyond): made-up tokens never take the tenants' slots.",
    )
    request_body_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Longest a request's body may take to arrive, from its headers on (408 and the connection closed "
        "beyond), so a slow client gives its request slot back.",
    )
    request_head_timeout_s: float = Field(
        10.0,
        gt=0,
        le=600,
        description="Longest `artsvc serve` waits for a request's head (its line and headers) on a new connection, "
        "or from the first byte of the next request on a kept-alive one, before closing the connection.",
    )
    inference_max_tokens: int = Field(
        512,
        ge=1,
        le=32_768,
        description="Largest max_tokens of POST /v1/chat/completions on a trained checkpoint, "
        "and what a request that names none gets (400 beyond).",
    )
    inference_max_prompt_tokens: int = Field(
        8_192,
        ge=1,
        le=1_048_576,
        description="Largest prompt tokens × n of one chat completion (each choice holds the prompt in memory); "
        "checked before any model work, 400 beyond.",
    )
    inference_max_completion_tokens: int = Field(
        2_048, ge=1, le=1_048_576, description="Largest n × max_tokens of one chat completion (400 beyond)."
    )
    inference_deadline_s: float = Field(
        30.0,
        gt=0,
        le=3_600,
        description="Seconds of model work one chat completion may spend encoding its prompt and sampling (not "
        "counting its waits while other callers' requests have the model); then it stops and the choices end with "
        "finish_reason `length` (empty if the prompt was not read yet), so one request's work is bounded.",
    )
    inference_max_waiting_per_tenant: int = Field(
        4,
        ge=0,
        le=1_000,
        description="Batches of chat completions one caller may have waiting for the inference process (429 beyond, "
        "for that caller only); the process serves the callers that wait round-robin. A caller's requests on one "
        "checkpoint that arrive together form one batch of up to 64 completions (an ART step's rollouts).",
    )
    inference_max_active_callers: int = Field(
        4,
        ge=1,
        le=64,
        description="Chat completions the inference process works on at once, one per caller; they take the model in "
        "turns of a quarter of a second, so a short chat is answered while another caller's long one runs. Each "
        "holds its prompt's cache (and its checkpoint, if evicted) in memory.",
    )
    inference_threads: int = Field(
        2, ge=1, le=256, description="Torch threads of the inference process (a child of the API at the workers' CPU "
        "priority, worker_cpu_policy)."
    )
    max_event_streams: int = Field(
        256, ge=1, le=100_000, description="Live event streams one API process serves at once (503 beyond)."
    )
    max_event_streams_per_tenant: int = Field(
        32, ge=1, le=100_000, description="Live event streams one caller may hold open in one API process at once (429 beyond)."
    )

    # Browser sessions and operator endpoints.
    session_ttl_s: int = Field(8 * 3600, ge=60, le=30 * 24 * 3600, description="How long a dashboard login lasts.")
    cookie_secure: bool = Field(
        False, description="Mark the dashboard's session cookie Secure (set it when a TLS proxy is in front)."
    )
    metrics_token: SecretStr | None = Field(
        None, description="Bearer token Prometheus sends to /metrics (operator tokens work too); unset, operators only."
    )

    @field_validator(
        "judge_models", "baseline_models", "client_backends", "client_base_models", "grader_functions", "trusted_hosts",
        "served_base_models", mode="before",
    )
    @classmethod
    def _split_models(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @field_validator("grader_functions")
    @classmethod
    def _functions_are_named_fully(cls, value: list[str]) -> list[str]:
        from judges.graders.registry import FUNCTION

        if bad := [name for name in value if not FUNCTION.fullmatch(name)]:
            raise ValueError(f"grader functions are 'package.module:function', not {bad}")
        return value

    @field_validator("served_base_models")
    @classmethod
    def _served_names_are_plain(cls, value: list[str]) -> list[str]:
        names = [entry.partition("=")[0] for entry in value]
        if bad := [n for n in names if not (n.isascii() and n[:1].isalnum() and len(n) <= 128
                                            and all(c.isalnum() or c in "._/-" for c in n))]:  # fmt: skip
            raise ValueError(f"served_base_models: {bad[0]!r} is not a model name (letters, digits, ._-/, up to 128)")
        return value

    def served_base_model(self, name: str) -> str | None:
        """The base model served as ``name`` (served_base_models), None if none is."""
        for served, _, source in (entry.partition("=") for entry in self.served_base_models):
            if served == name:
                return source or served
        return None

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        """Absolute once, here: every path made from it (checkpoints, the base-model cache an adapter records, the
        SQLite URL) stays valid whatever the working directory is later."""
        return value.expanduser().resolve()

    @model_validator(mode="after")
    def _refuse_open_local_mode(self) -> Settings:
        if self.local_mode and not is_loopback(self.host):
            raise ValueError(
                f"local_mode serves every request as the operator; refusing it on non-loopback host {self.host!r}"
            )
        return self

    def refuse_reward(self, reward: RewardSpec) -> str | None:
        """Why this server will not run a job with ``reward``: it names a judge model (RULER's, or a score_model
        grader's) that the operator does not allow, or a code grader the operator has not registered. None if it
        may. Imports nothing a job names."""
        if reward.judge_model is not None and (refusal := self.refuse_judge(reward.judge_model)) is not None:
            return refusal
        if reward.grader is not None:
            from judges.graders import GraderConfigError, check_grader  # config models only: cheap to import

            try:
                check_grader(
                    reward.grader, allowed_models=set(self.judge_models), registry=self.code_graders().registry
                )
            except GraderConfigError as exc:
                return f"reward.grader: {exc}"
        return None

    def refuse_judge(self, model: str) -> str | None:
        """Why this server will not let ``model`` judge as RULER (``reward.judge_model``); None if it may."""
        if model in self.judge_models:
            return None
        allowed = ", ".join(self.judge_models) or "none (the operator sets ARTSVC_JUDGE_MODELS)"
        return f"reward.judge_model: {model!r} is not a judge this server allows; allowed: {allowed}"

    def code_graders(self) -> CodeGraders:
        """The python graders jobs may name (the artsvc.graders entry points and grader_functions, read from
        package metadata, nothing imported) and the limits each call runs under."""
        from judges.graders import CodeGraders, GraderRegistry

        registry = GraderRegistry.load(self.grader_functions)
        return CodeGraders(registry, memory_mb=self.grader_memory_mb, processes=self.grader_processes)

    def refuse_baseline(self, model: str, *, field: str) -> str | None:
        """Why this server will not evaluate ``model`` (named in ``field``); None if it may."""
        if model in self.baseline_models:
            return None
        allowed = ", ".join(self.baseline_models) or "none (the operator sets ARTSVC_BASELINE_MODELS)"
        return f"{field}: {model!r} is not a baseline model this server allows; allowed: {allowed}"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'artsvc.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
