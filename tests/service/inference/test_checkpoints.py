"""The inference process's checkpoints: the next checkpoint of a training (an adapter of the same shape on the same
base) is swapped into the loaded model, its weights copied in, and answers as if loaded afresh; a model a message is
answering with is never swapped under it."""

from __future__ import annotations

import pytest
import torch

from service.backends.openai_server import ChatCompletionRequest
from service.backends.transformers.inference import CheckpointModel
from service.inference.child import Checkpoints
from tests.service import adapter_checkpoints as ckpt


@pytest.fixture(scope="module")
def adapters(tiny_lm, tmp_path_factory) -> tuple[ckpt.Adapter, ckpt.Adapter]:
    folder = tmp_path_factory.mktemp("adapters")
    return ckpt.make_adapter(tiny_lm, folder / "a", seed=1), ckpt.make_adapter(tiny_lm, folder / "b", seed=2)


REQUEST = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "Hello there"}],
                                                 "max_tokens": 6, "temperature": 0, "logprobs": True})  # fmt: skip


def greedy(model) -> list[str]:
    sampling = model.sampling_request(REQUEST, default_max_tokens=6)
    [body] = model.complete_many([(REQUEST, sampling, "m")])
    return [entry["token"] for entry in body["choices"][0]["logprobs"]["content"]]


def test_the_next_checkpoint_is_swapped_into_the_loaded_model_and_answers_as_loaded_afresh(adapters):
    first, second = adapters
    checkpoints = Checkpoints(precision="float32")
    loaded = checkpoints.get(first.folder, "a")
    assert torch.allclose(ckpt.logits_of(loaded.model), first.logits, atol=1e-5)
    greedy(loaded)  # its prompt's states cached under the first adapter's weights
    swapped = checkpoints.get(second.folder, "b")
    assert swapped is loaded  # the base stayed
    assert torch.allclose(ckpt.logits_of(swapped.model), second.logits, atol=1e-5)
    assert greedy(swapped) == greedy(CheckpointModel(second.folder, precision="float32"))  # no stale cached state
    assert not torch.allclose(second.logits, first.logits, atol=1e-3)  # the swap is what changed the answer
    assert checkpoints.get(second.folder, "b") is swapped  # now cached as the second's


def test_a_model_in_use_is_not_swapped(adapters):
    first, second = adapters
    checkpoints = Checkpoints(precision="float32")
    loaded = checkpoints.get(first.folder, "a")
    checkpoints.hold(loaded)
    other = checkpoints.get(second.folder, "b")
    assert other is not loaded
    assert torch.allclose(ckpt.logits_of(loaded.model), first.logits, atol=1e-5)
    assert torch.allclose(ckpt.logits_of(other.model), second.logits, atol=1e-5)
    checkpoints.release(loaded)
