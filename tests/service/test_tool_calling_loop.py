"""A tool-using agent through the whole loop on a real (tiny, random) LM: the email environment's episodes sample
tool calls from the transformers backend's policy server, its tools answer them, the verifier scores them, and a
GRPO step trains on them through ART's tokenisation, after a warm start on the teacher's tool calls.

A random model never writes a well-formed call, so the sampler here is teacher-forced: a script picks each reply's
tokens (a valid search or a malformed call, then an answer), and the real model gives their log-probabilities, as
the real sampler would report them. Everything after the choice of tokens is the product's own code."""

from __future__ import annotations

import json
import math
from collections import defaultdict

import pytest
import torch
from sqlmodel import Session, select

from environments.email import EmailEnvironment
from service.backends.openai_server import Sample
from service.backends.transformers import chat, training
from service.backends.transformers.engine import PolicyEngine
from service.runner.control import JobHooks
from service.spec import JobSpec
from service.store import db as store_db
from service.store import runs
from service.store.tables import BASE_STEP, JobStatus, SampledTrajectory, StopReason

SEARCH = '<tool_call>\n{"name": "search_inbox", "arguments": {"keywords": "meeting"}}\n</tool_call>'
MALFORMED = '<tool_call>\n{"name": "search_inbox", "arguments": {"keywords": </tool_call>'
# what the environment asks for: every reply one call of its tools (tool_choice required, parallel_tool_calls false)
ONE_CALL = chat.tool_call_grammar("required", chat.tools_as_trained(list(EmailEnvironment.tools)), False)
ANSWER = '<tool_call>\n{"name": "return_final_answer", "arguments": {"answer": "no idea", "source_ids": []}}\n</tool_call>'


def _teacher_forced(monkeypatch) -> list[str]:
    """Replace the policy's sampler: a first turn alternates a valid search and a malformed call for each distinct
    prompt (a group's rollouts share theirs, so a group holds both), a later turn answers; the model scores the
    tokens. Returns the replies written, in order."""
    seen: dict[tuple[int, ...], int] = defaultdict(int)
    written: list[str] = []

    def forced(self, requests, step=None):
        end = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        samples = []
        for request in requests:
            assert request.grammar == ONE_CALL
            prompt = request.prompt_ids
            if "<tool_response>" in self.tokenizer.decode(prompt):  # a tool has answered: the episode's last turn
                text = ANSWER
            else:
                text = (SEARCH, MALFORMED)[seen[prompt] % 2]
                seen[prompt] += 1
            ids = self.tokenizer.encode(text, add_special_tokens=False) + [end]
            written.append(text)
            samples.append([Sample(text=text, token_ids=ids, logprobs=_logprobs(self.model, prompt, ids),
                                   finish_reason="stop", context_tokens=len(prompt))])  # fmt: skip
        return samples

    monkeypatch.setattr(PolicyEngine, "generate", forced)
    return written


def _logprobs(model: torch.nn.Module, prompt: tuple[int, ...], reply: list[int]) -> list[float]:
    """The model's log-probability of each reply token after the prompt, by the trainer's own computation."""
    tokens = torch.tensor([[*prompt, *reply]], device=model.device)
    n = tokens.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool, device=model.device).tril().unsqueeze(0)
    with torch.no_grad():
        logprobs, _ = training.token_logprobs(model, tokens, causal, torch.arange(n, device=model.device).unsqueeze(0))
    return logprobs[0, len(prompt) - 1 : n - 1].float().tolist()


@pytest.mark.asyncio
async def test_tool_calls_go_through_the_whole_loop_on_the_tiny_model(tmp_path, tiny_lm, monkeypatch):
    from service.training.loop import run_job

    written = _teacher_forced(monkeypatch)
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store_db.upgrade(url)
    engine = store_db.make_engine(url)
    spec = {
        "environment": "email",
        "model": {"backend": "transformers", "base_model": str(tiny_lm)},
        "training": {"warm_start_examples": 2, "max_steps": 1, "groups_per_step": 1, "group_size": 4},
        "validation": {"every_n_steps": 1, "max_examples": 2},
        "seed": 3,
    }
    with Session(engine) as session:
        job_id = runs.create_job(session, spec=JobSpec.model_validate(spec)).id
        session.commit()

    job = await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=JobHooks(trajectories_per_step=8))

    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.max_steps and job.step == 1
    with Session(engine) as session:
        [step] = runs.steps(session, job_id=job_id)
        points = runs.validation_points(session, job_id=job_id, with_base=True)
        train = session.exec(select(SampledTrajectory).where(SampledTrajectory.job_id == job_id,
                                                             SampledTrajectory.split == "train")).all()  # fmt: skip
    assert [p.step for p in points] == [BASE_STEP, 0, 1]  # the warm start on the teacher's calls ran between
    assert set(written) == {SEARCH, MALFORMED, ANSWER}
    # the group held a valid search and a malformed call: its rewards differ, so the step trained on the calls
    assert step.metrics["trainable_groups"] == 1 and math.isfinite(step.loss) and step.loss != 0.0
    # its KL is to the warm start, where RL began, and the first step's policy is that very adapter: 0 (to the base
    # model, after this warm start's one small optimizer step, it was 3e-7)
    assert step.kl is not None and step.kl < 1e-9, step.kl
    # every reply of the four episodes was trained on (about 70 tokens each), none cut off behind the long opening
    assert step.metrics["trained_tokens"] >= 4 * 60, step.metrics
    assert len({round(t.reward, 6) for t in train}) == 2
    for rollout in train:
        calls = [m for m in rollout.messages if m["role"] == "assistant" and m.get("tool_calls")]
        answers = [m for m in rollout.messages if m["role"] == "tool"]
        assert len(calls) == 2 and len(answers) == 2, rollout.messages
        assert calls[-1]["tool_calls"][0]["function"]["name"] == "return_final_answer"
        first = calls[0]["tool_calls"][0]["function"]
        if first["arguments"] == json.dumps({"keywords": "meeting"}):  # the search ran: its hits or none came back
            assert not answers[0]["content"].startswith("error"), answers[0]
        else:  # the malformed call was answered with the tool's error, and the episode went on
            assert answers[0]["content"].startswith("error"), answers[0]
        assert rollout.details["metadata"]["outcome"] == "wrong_answer"
