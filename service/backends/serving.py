"""What every backend that trains in this process shares: one worker thread that owns the model, and an
OpenAI-compatible server on loopback (started when a model is first prepared for training) that the
environments' rollouts talk to, as they would to vLLM. Rollouts in this process call the server's app directly
(:meth:`LoopbackServing.direct_http_client`); the loopback port serves everyone else."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import secrets
import socket
from concurrent.futures import ThreadPoolExecutor
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import httpx
import uvicorn
from art.types import TrainResult

from service.backends.openai_server import ChatFormat, Generate, ServingError, build_app

if TYPE_CHECKING:
    import art
    from art import dev
    from art.types import TrainSFTConfig


# ART's options of its loss (art/loss.py) and of its packing (advantage_balance) that a train() call may give
LOSS_OPTIONS = frozenset({
    "epsilon", "epsilon_high", "ppo", "importance_sampling_level", "max_negative_advantage_importance_sampling_weight",
    "mask_prob_ratio", "kimi_k2_tau", "advantage_balance",
})  # fmt: skip


class TimedASGITransport(httpx.ASGITransport):
    """httpx's ASGI transport with the request's timeout: httpx's own ignores it, so a model call that never returned
    would hang its rollout for good, where over a socket the client gives up after its read timeout (ART's: 1,200 s).
    The whole call is bounded by the read timeout (the app answers all at once, so there is no byte to wait between),
    and running past it raises :class:`httpx.ReadTimeout`, as a socket's client would: the caller retries or fails
    the rollout the same way."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        limit = request.extensions.get("timeout", {}).get("read")
        if limit is None:
            return await super().handle_async_request(request)
        try:
            async with asyncio.timeout(limit):
                return await super().handle_async_request(request)
        except TimeoutError as exc:
            raise httpx.ReadTimeout(f"no answer within {limit} s", request=request) from exc


class ClosingEachConnection:
    """ASGI middleware: every response says ``Connection: close``, so a client holds no idle connection to this server.

    ART's inference client keeps up to 100,000 idle keep-alive connections, and httpx's pool checks every idle one
    (a ``getpeername`` and a readability poll) each time a request is sent and each time a response is closed: a
    validation's 200 concurrent requests, once the first sweep left 200 idle connections behind, cost the event loop
    about 5.6 s of CPU a round, holding the GIL the model thread needs between its products. With each connection
    closed after its response, a round costs 0.9 s (``bench/loopback_http.py``): a new loopback connection per
    request is what that costs. In the main job the rollouts took 17-26% less time (README, Results)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def closing(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"connection", b"close")]}
            await send(message)

        await self.app(scope, receive, closing)


class _QuietServer(uvicorn.Server):
    """A uvicorn server that leaves signal handling to the program embedding it."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[override]
        yield


def parse_model_name(model: str) -> tuple[str, int | None]:
    """``name`` or ``name@step``; a step that is not a number is a 404 (no such model)."""
    name, at, step_text = model.partition("@")
    if not at:
        return name, None
    if not (step_text.isascii() and step_text.isdigit()) or len(step_text) > 9:  # isdigit alone admits "²"
        raise ServingError(404, f"model {name!r} has no checkpoint for step {step_text!r}", "model_not_found")
    return name, int(step_text)


@dataclass(frozen=True)
class SftBatches:
    """ART's supervised batches of ``size`` trajectories, each with its learning rate (``learning_rate``: one for all,
    or ART's list, one per batch), read from ``trajectories`` as they are iterated: one batch is held at a time, so a
    stream of demonstrations stays a stream. Iterating again reads ``trajectories`` again (a re-iterable source can be
    read twice). ValueError at the first batch that has no learning rate in ART's list; fewer batches than rates
    (a source shorter than announced) end the schedule early."""

    trajectories: Iterable[art.Trajectory]
    size: int
    learning_rate: float | list[float]

    def __iter__(self) -> Iterator[tuple[list[art.Trajectory], float]]:
        items = iter(self.trajectories)
        given = self.learning_rate
        rates = iter(given) if isinstance(given, list) else itertools.repeat(given)
        while batch := list(itertools.islice(items, self.size)):
            if (rate := next(rates, None)) is None:
                raise ValueError(f"{len(given)} learning rates given for more batches")  # type: ignore[arg-type]
            yield batch, rate


class LoopbackServing:
    """The server's life cycle and the model thread; subclasses give ``_generate`` and their chat format."""

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, thread_name: str = "policy") -> None:
        self._host, self._port = host, port
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._api_key = secrets.token_urlsafe(24)
        self._server: _QuietServer | None = None
        self._server_task: asyncio.Task[None] | None = None
        self._base_url: str | None = None
        self._app: Any = None
        self._direct_client: httpx.AsyncClient | None = None
        self._closing = False

    async def _serve(self, generate: Generate, fmt: ChatFormat) -> tuple[str, str]:
        """Start the server once; its base URL and API key."""
        if self._server is None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self._host, self._port))
            app = self._app = ClosingEachConnection(build_app(generate, self._api_key, fmt))
            self._server = _QuietServer(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
            self._server_task = asyncio.create_task(self._server.serve(sockets=[sock]))
            while not self._server.started:
                if self._server_task.done():
                    await self._server_task  # surfaces the start-up error
                await asyncio.sleep(0.01)
            host, port = sock.getsockname()[:2]
            self._base_url = f"http://{host}:{port}/v1"
        assert self._base_url is not None
        return self._base_url, self._api_key

    @property
    def base_url(self) -> str | None:
        """Where the OpenAI-compatible server listens, once a model is prepared for training."""
        return self._base_url

    def direct_http_client(self) -> httpx.AsyncClient | None:
        """An HTTP client for the server's own requests from this process: it calls the server's app in the calling
        task (httpx's ASGI transport) instead of over a loopback connection. The same app answers, with the same
        status codes and bodies (an app's error is a 500, as over TCP); what is skipped is the connection, uvicorn's
        parsing and httpx's pool: 0.38 against 0.92 s of the event loop's CPU for a validation's 200 requests
        (``bench/loopback_http.py``, a 2-core AMX Xeon), time the model thread waits for its batch. None until the
        server started."""
        if self._app is None:
            return None
        if self._direct_client is None:
            transport = TimedASGITransport(app=self._app, raise_app_exceptions=False)
            self._direct_client = httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(1200, connect=5.0))
        return self._direct_client

    async def close(self) -> None:
        """Stop serving, then the model thread. Requests still in flight (the rollouts of a step a stop dropped) are
        answered 503 at once rather than computed: only the model call under way ends first."""
        self._closing = True
        if self._server is not None and self._server_task is not None:
            self._server.should_exit = True
            await self._server_task
        self._server = self._server_task = None
        if self._direct_client is not None:
            await self._direct_client.aclose()
        self._app = self._direct_client = None
        self._executor.shutdown(wait=True)

    async def _run(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn`` on the model thread: training and sampling never overlap."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, lambda: self._unless_closing(fn, *args, **kwargs))

    def _unless_closing(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._closing:
            raise ServingError(503, "the backend is closing", "unavailable")
        return fn(*args, **kwargs)


class InProcessBackend(LoopbackServing):
    """The ART protocol methods every backend that keeps one engine (with a ``step``) per model shares."""

    sft_batch_size: int  # trajectories per supervised optimizer step when ART's config says "auto"

    def __init__(self, **serving: Any) -> None:
        super().__init__(**serving)
        self._engines: dict[str, Any] = {}

    async def close(self) -> None:
        """Stop serving, then let the models go. The server's endpoints reach this backend, and FastAPI keeps them in
        process-wide caches after the server stopped: holding its engines, a worker that trains job after job kept
        every finished job's model loaded."""
        await super().close()
        self._engines.clear()

    def _model_inference_name(self, model: art.Model, step: int | None = None) -> str:
        engine = self._engines.get(model.name)
        current = engine.step if engine is not None else 0
        return f"{model.name}@{current if step is None else step}"

    async def _get_step(self, model: art.TrainableModel) -> int:
        return self._engine(model.name).step

    def _engine(self, name: str) -> Any:
        try:
            return self._engines[name]
        except KeyError:
            raise ValueError(f"model {name!r} is not registered with this backend") from None

    async def train(
        self,
        model: art.TrainableModel,
        trajectory_groups: Iterable[art.TrajectoryGroup],
        *,
        learning_rate: float = 1e-4,
        kl_penalty_coef: float = 0.0,
        scale_rewards: bool = True,
        **options: Any,
    ) -> TrainResult:
        """One GRPO step (the engine's part is ``_grpo``). Groups whose rewards are all equal carry no advantage: they
        are counted, not trained. ART's loss and packing options (``LOSS_OPTIONS``: epsilon, ppo, importance sampling
        level...) reach its loss where given; its other keyword arguments (GPU scheduling) do not apply here."""
        engine = self._engine(model.name)
        groups = list(trajectory_groups)
        zero_variance = sum(1 for g in groups if len({t.reward for t in g.trajectories}) <= 1)
        given = {key: value for key, value in options.items() if key in LOSS_OPTIONS and value is not None}
        config = cast("dev.TrainConfig", {"kl_penalty_coef": kl_penalty_coef, **given})
        metrics = await self._grpo(engine, groups, learning_rate=learning_rate, config=config,
                                   scale_rewards=scale_rewards)  # fmt: skip
        counts = {"trainable_groups": float(len(groups) - zero_variance), "zero_variance_groups": float(zero_variance),
                  "learning_rate": learning_rate}  # fmt: skip
        return TrainResult(step=engine.step, metrics={**metrics, **counts})

    async def _grpo(
        self, engine: Any, groups: list[art.TrajectoryGroup], *, learning_rate: float, config: dev.TrainConfig,
        scale_rewards: bool,
    ) -> dict[str, float]:  # fmt: skip
        raise NotImplementedError

    async def _delete_checkpoint_files(self, model: art.TrainableModel, steps_to_keep: list[int]) -> None:
        await self._run(self._engine(model.name).keep_only, steps_to_keep)

    async def _train_sft(
        self,
        model: art.TrainableModel,
        trajectories: Iterable[art.Trajectory],
        config: TrainSFTConfig,
        dev_config: dev.TrainSFTConfig,
        verbose: bool = False,
    ) -> AsyncIterator[dict[str, float]]:
        """ART's supervised fine-tuning: one optimizer step per ``config.batch_size`` trajectories, in order, each at
        its own learning rate when ART gives a list (one per batch); the engine's part is ``_sft``. The trajectories
        are read a batch at a time as they are trained (``SftBatches``)."""
        size = self.sft_batch_size if config.batch_size == "auto" else int(config.batch_size)
        async for metrics in self._sft(self._engine(model.name), SftBatches(trajectories, size, config.learning_rate)):
            yield metrics

    def _sft(self, engine: Any, batches: SftBatches) -> AsyncIterator[dict[str, float]]:
        raise NotImplementedError
