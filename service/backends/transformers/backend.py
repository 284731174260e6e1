"""``TransformersBackend``: ART's ``Backend`` protocol for any causal LM that transformers loads offline.

``register`` resolves the base model (converting a GGUF file once) and loads or resumes the model's LoRA adapter;
``_prepare_backend_for_training`` starts the OpenAI-compatible server on loopback; ``train`` takes one GRPO step
through ART's tokenisation, packing and loss; ``_train_sft`` warm-starts through ART's tokeniser. Requests that
arrive together (the rollouts of a step, a validation sweep) are decoded together, as vLLM batches them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import art
from art import dev

from service.backends import layout
from service.backends.batching import gathered
from service.backends.openai_server import Sample, ServingError
from service.backends.serving import InProcessBackend, SftBatches, parse_model_name
from service.backends.transformers.engine import LoraSettings, PolicyEngine, default_device
from service.backends.transformers.generation import SamplingRequest
from service.backends.transformers.models import CONVERTED, resolve_base_model
from service.backends.transformers.precision import Precision, dtype_name, resolve
from service.backends.transformers.template_chat import TemplateChat
from service.gc_frozen import collector_paused, hold_frozen

# A decoding step of a small model costs nearly the same for 8 rows as for 64 (its weights are read and its hundreds of
# products dispatched once either way), so short rows go in batches of up to 128. What a batch holds is its rows' KV
# cache: MAX_BATCH_TOKENS (rows x (prompt + max_tokens)) keeps a batch of long agent turns at what 64 rows of 1,500
# tokens held before (2.2 GB in bf16 for SmolLM2). More rows than one batch takes are split evenly (balanced_rows).
MAX_BATCH_ROWS = 128
MAX_BATCH_TOKENS = 96 * 1024


@dataclass
class _Pending:
    key: tuple[str, int | None]
    request: SamplingRequest
    future: asyncio.Future[list[Sample]]


class TransformersBackend(InProcessBackend):
    """Trains LoRA adapters on real LMs in this process (CUDA when present, else the CPU) and serves them.

    ``path`` holds one directory per model (ART's layout); ``cache_dir`` the converted base models; ``precision`` the
    base models' dtype (precision.py), whose name ``precision`` holds once resolved for this machine;
    ``max_sequence_tokens`` the longest trajectory a step trains on (None: any; a client's batches are bounded).
    """

    sft_batch_size = 16

    def __init__(self, *, path: str | Path, cache_dir: str | Path, seed: int = 0, lora: LoraSettings = LoraSettings(),
                 precision: Precision = "auto", max_sequence_tokens: int | None = None, host: str = "127.0.0.1",
                 port: int = 0) -> None:  # fmt: skip
        super().__init__(host=host, port=port, thread_name="transformers-policy")
        self.max_sequence_tokens = max_sequence_tokens
        self._path, self._cache_dir = Path(path), Path(cache_dir)
        self._seed, self._lora = seed, lora
        self._dtype = resolve(precision, default_device())
        self.precision = dtype_name(self._dtype)
        self._pending: list[_Pending] = []
        self._batcher: asyncio.Task[None] | None = None
        self._frozen: list[Callable[[], None]] = []  # a hold on the garbage collector's frozen objects per model loaded

    # -- ART Backend protocol ---------------------------------------------------------------

    async def register(self, model: art.Model) -> None:
        if not isinstance(model, art.TrainableModel):
            raise TypeError("the transformers backend trains and serves TrainableModel instances only")
        base_dir = await self._run(resolve_base_model, model.base_model, self._cache_dir / CONVERTED)
        model_dir = layout.model_dir(self._path, model.name, model.project)
        with collector_paused():
            self._engines[model.name] = await self._run(PolicyEngine, model_dir, base_dir, lora=self._lora,
                                                       seed=self._seed, dtype=self._dtype)  # fmt: skip
        # the model and the libraries it took are here for the backend's life: no full collection walks them
        # (gc_frozen.py; what the job makes after this, the collector sees)
        self._frozen.append(hold_frozen())

    async def close(self) -> None:
        await super().close()
        while self._frozen:
            self._frozen.pop()()

    async def _prepare_backend_for_training(
        self, model: art.TrainableModel, config: dev.OpenAIServerConfig | None = None
    ) -> tuple[str, str]:
        return await self._serve(self._generate, TemplateChat(lambda name: self._engine_for(name).tokenizer,
                                                              replies_for=lambda name: self._engine_for(name).replies))

    async def _grpo(
        self, engine: PolicyEngine, groups: list[art.TrajectoryGroup], *, learning_rate: float, config: dev.TrainConfig,
        scale_rewards: bool,
    ) -> dict[str, float]:  # fmt: skip
        return await self._run(engine.grpo_step, groups, learning_rate=learning_rate, config=config,
                               scale_rewards=scale_rewards, max_tokens=self.max_sequence_tokens)  # fmt: skip

    async def _sft(self, engine: PolicyEngine, batches: SftBatches) -> AsyncIterator[dict[str, float]]:
        """Fine-tune on each batch's assistant turns; the result becomes step 0 and the KL reference (engine.py)."""
        for batch, rate in batches:
            yield await self._run(engine.sft_step, batch, rate)
        await self._run(engine.finish_sft)

    # -- serving ----------------------------------------------------------------------------

    def _engine_for(self, model: str) -> PolicyEngine:
        name, _ = parse_model_name(model)
        if (engine := self._engines.get(name)) is None:
            raise ServingError(404, f"model {model!r} does not exist", "model_not_found")
        return engine

    async def _generate(self, model: str, request: SamplingRequest) -> tuple[str, list[Sample]]:
        name, step = parse_model_name(model)
        engine = self._engine_for(model)
        if step is not None and step != engine.step and step not in engine.steps():
            raise ServingError(404, f"model {name!r} has no checkpoint for step {step}", "model_not_found")
        future: asyncio.Future[list[Sample]] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending((name, step if step != engine.step else None), request, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._decode_batches())
        samples = await future
        return f"{name}@{engine.step if step is None else step}", samples

    async def _decode_batches(self) -> None:
        """Decode what is pending, a model step at a time, until nothing is."""
        while self._pending:
            await gathered(lambda: len(self._pending))
            key = self._pending[0].key
            waiting = [item for item in self._pending if item.key == key]
            batch, rows, limit = [], 0, balanced_rows([item.request for item in waiting])
            for item in waiting:
                if batch and rows + item.request.n > limit:
                    break
                batch.append(item)
                rows += item.request.n
                self._pending.remove(item)
            engine = self._engines[key[0]]
            try:
                results = await self._run(engine.generate, [item.request for item in batch], key[1])
            except Exception as exc:  # noqa: BLE001 - every waiting request gets the error
                for item in batch:
                    if not item.future.done():
                        item.future.set_exception(exc)
            else:
                for item, samples in zip(batch, results):
                    if not item.future.done():
                        item.future.set_result(samples)


def balanced_rows(requests: list[SamplingRequest]) -> int:
    """How many rows the next batch of ``requests`` (one model's, oldest first) takes: all of them where they fit in
    one batch, else an even share of as few batches as hold them, so no batch is a short tail decoded at a full batch's
    cost (a validation's 200 rows: two of 100, not 64, 64, 64 and 8). A batch fits MAX_BATCH_ROWS rows and
    MAX_BATCH_TOKENS tokens of context, counted at the requests' longest row."""
    rows = sum(r.n for r in requests)
    longest = max((len(r.prompt_ids) + r.max_tokens for r in requests), default=1)
    per_batch = max(1, min(MAX_BATCH_ROWS, MAX_BATCH_TOKENS // longest))
    batches = max(1, -(-rows // per_batch))
    return -(-rows // batches)
