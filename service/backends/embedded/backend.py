"""``EmbeddedBackend``: ART's ``Backend`` protocol on the CPU, with a real policy that learns.

It is to ART's GPU backends what SQLite is to PostgreSQL: the same contract, a smaller engine.
``register`` loads or creates the model's policy; ``_prepare_backend_for_training`` starts an
OpenAI-compatible server on loopback; ``_train_sft`` warm-starts from demonstrations (cached by
content, since training is deterministic); ``train`` takes a GRPO step and checkpoints it.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import art
import torch
from art import dev

from service.backends.embedded import toolcalls
from service.backends.embedded.engine import PolicyEngine
from service.backends.embedded.objectives import GRPOConfig, group_advantages
from service.backends.embedded.policy import PRESETS
from service.backends.embedded.sampler import SamplingRequest
from service.backends.embedded.sequences import TokenSequence, trajectory_windows
from service.backends.embedded.tokenizer import decode_token, render_prompt
from service.backends.openai_server import ChatCompletionRequest, Sample, ServingError
from service.backends.serving import InProcessBackend, SftBatches, parse_model_name

FINGERPRINT_BATCHES_AT_ONCE = 16  # batches of a warm start fingerprinted per call on the model thread


class CharacterChat:
    """The character policy's chat format: its own renderer, one character per token, its tool-call text. Its replies
    are held to no grammar (``response_format`` and ``tool_choice`` read as free text and ``auto``): a policy trained
    from scratch writes the convention its warm start taught it, and the reward enforces it."""

    def sampling_request(self, request: ChatCompletionRequest, *, max_tokens: int, stop: tuple[str, ...]) -> SamplingRequest:
        return SamplingRequest(
            prompt_ids=render_prompt(request.messages),
            n=request.n,
            temperature=request.temperature,
            max_tokens=max_tokens,
            stop=stop,
            seed=request.seed,
            top_logprobs=request.top_logprobs or 0,
        )

    def token_text(self, model: str, token_id: int) -> tuple[str, bytes]:
        text = decode_token(token_id)
        return text, text.encode()

    def parse_tool_calls(self, text: str, *, call_id_prefix: str) -> toolcalls.ParsedReply:
        return toolcalls.parse(text, call_id_prefix=call_id_prefix)


class EmbeddedBackend(InProcessBackend):
    """Trains small character-level policies in this process and serves them over HTTP.

    ``path`` holds one directory per model (checkpoints, reference); ``cache_dir`` keeps
    finished warm starts so identical fine-tuning runs are done once. ``seed`` seeds the
    initial weights of new models.
    """

    sft_batch_size = 64

    def __init__(
        self, *, path: str | Path, cache_dir: str | Path | None = None, seed: int = 0, host: str = "127.0.0.1", port: int = 0
    ) -> None:
        super().__init__(host=host, port=port, thread_name="embedded-policy")
        self._path = Path(path)
        self._cache_dir = Path(cache_dir) if cache_dir is not None else self._path / "cache"
        self._seed = seed

    # -- ART Backend protocol ---------------------------------------------------------------

    async def register(self, model: art.Model) -> None:
        if not isinstance(model, art.TrainableModel):
            raise TypeError("the embedded backend trains and serves TrainableModel instances only")
        if model.base_model not in PRESETS:
            raise ValueError(f"unknown embedded base model {model.base_model!r}; choose one of {sorted(PRESETS)}")
        model_dir = self._path / model.project / "models" / model.name
        self._engines[model.name] = await self._run(PolicyEngine, model_dir, PRESETS[model.base_model], seed=self._seed)

    async def _prepare_backend_for_training(
        self, model: art.TrainableModel, config: dev.OpenAIServerConfig | None = None
    ) -> tuple[str, str]:
        return await self._serve(self._generate, CharacterChat())

    async def _grpo(
        self, engine: PolicyEngine, groups: list[art.TrajectoryGroup], *, learning_rate: float, config: dev.TrainConfig,
        scale_rewards: bool,
    ) -> dict[str, float]:  # fmt: skip
        """Each trajectory cut into context-sized windows that carry its group-normalised advantage. Of ART's loss
        options, its own loss takes the KL penalty and epsilon."""
        sequences: list[TokenSequence] = []
        for group in groups:
            advantages = group_advantages((t.reward for t in group.trajectories), scale=scale_rewards)
            for trajectory, advantage in zip(group.trajectories, advantages or []):
                for window in trajectory_windows(
                    trajectory.messages_and_choices, block_size=engine.config.block_size, train_on_messages=False
                ):
                    window.advantage = advantage
                    sequences.append(window)
        epsilon = config.get("epsilon")
        grpo = GRPOConfig(kl_penalty_coef=config.get("kl_penalty_coef", 0.0),
                          **({} if epsilon is None else {"epsilon": epsilon}))  # fmt: skip
        return await self._run(engine.grpo_step, sequences, learning_rate=learning_rate, grpo=grpo)

    async def _sft(self, engine: PolicyEngine, batches: SftBatches) -> AsyncIterator[dict[str, float]]:
        """Fine-tune on each batch's assistant turns, each trajectory cut into context-sized windows.

        The result replaces the current checkpoint and becomes the KL reference. A run whose
        start weights, data and schedule were seen before is loaded from the cache instead: the
        batches are read once to fingerprint the run (nothing kept), then again to train it.
        """
        block_size = engine.config.block_size
        if iter(batches.trajectories) is batches.trajectories:  # a one-shot iterator: kept, to be read twice
            batches = dataclasses.replace(batches, trajectories=list(batches.trajectories))

        def windowed() -> Iterator[tuple[list[TokenSequence], float]]:
            for batch, rate in batches:
                yield [w for t in batch for w in trajectory_windows(t.messages_and_choices, block_size=block_size,
                                                                    train_on_messages=True)], rate  # fmt: skip

        fingerprint, source, count = await self._run(engine.sft_fingerprint, batches.size), windowed(), 0

        def fingerprint_some() -> int:
            read = 0
            for sequences, rate in itertools.islice(source, FINGERPRINT_BATCHES_AT_ONCE):
                engine.add_to_fingerprint(fingerprint, sequences, rate)
                read += 1
            return read

        while read := await self._run(fingerprint_some):  # in pieces: a task cancelled meanwhile stops soon
            count += read
        cached = self._cache_dir / "sft" / f"{fingerprint.hexdigest()}.pt"
        if cached.exists():
            await self._run(engine.load_sft_result, cached)
            yield {"cache_hit": 1.0, "batches": float(count)}
        else:
            await self._run(engine.begin_sft)
            for batch, rate in windowed():
                yield await self._run(engine.sft_step, batch, rate)
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_suffix(".tmp")
            torch.save(engine.policy.state_dict(), tmp)
            tmp.replace(cached)
        await self._run(engine.finish_sft)

    # -- serving ----------------------------------------------------------------------------

    async def _generate(self, model: str, request: SamplingRequest) -> tuple[str, list[Sample]]:
        name, step = parse_model_name(model)
        engine = self._engines.get(name)
        if engine is None:
            raise ServingError(404, f"model {model!r} does not exist", "model_not_found")
        if step is not None and step not in engine.checkpoints.steps() and step != engine.step:
            raise ServingError(404, f"model {name!r} has no checkpoint for step {step}", "model_not_found")
        samples = await self._run(engine.generate, request, step)
        return f"{name}@{engine.step if step is None else step}", samples
