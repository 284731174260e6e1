"""The worker's side of code graders: a stored job is checked again against the worker's own registry before it
trains, so a name that got into the store unregistered never runs, and a registered one runs through the judge the
training loop uses."""

from __future__ import annotations

import sys

import art
import pytest
from sqlmodel import Session

from judges.usage import JudgeBudget
from service.settings import Settings
from service.spec import RewardSpec
from service.store import runs
from service.store.tables import JobStatus
from service.training.judging import JudgeNotAllowed, judge_for
from service.training.loop import run_job
from tests.service.test_training_loop import TINY_RUN, _submit

REGISTERED = "tests.judges.grader_functions:exact"


def python(function: str) -> dict:
    return {"mode": "grader", "grader": {"type": "python", "name": "fn", "function": function}}


@pytest.mark.asyncio
async def test_a_stored_job_naming_an_unregistered_function_fails_before_anything_is_imported(engine, tmp_path):
    job_id = _submit(engine, {**TINY_RUN, "reward": python("this.x:y")})  # the spec's own check is its shape only
    assert "this" not in sys.modules
    settings = Settings(_env_file=None, data_dir=tmp_path / "data", grader_functions=[REGISTERED])
    with pytest.raises(JudgeNotAllowed, match="'this.x:y' is not a registered grader function"):
        await run_job(job_id, db=engine, data_dir=tmp_path / "data", settings=settings)
    with Session(engine) as session:
        job = runs.get_job(session, job_id=job_id)
    assert job.status is JobStatus.failed and "not a registered grader function" in job.error
    assert "this" not in sys.modules


@pytest.mark.asyncio
async def test_a_registered_function_grades_through_the_workers_judge(tmp_path):
    settings = Settings(_env_file=None, data_dir=tmp_path / "data", grader_functions=[REGISTERED])
    judge = judge_for(RewardSpec.model_validate(python(REGISTERED)), settings, {"s": {"answer": 42}}, JudgeBudget(None))

    def reply(text: str) -> art.Trajectory:
        return art.Trajectory(messages_and_choices=[{"role": "user", "content": "6 x 7?"},
                                                    {"role": "assistant", "content": text}])  # fmt: skip

    judged = await judge.judge(art.TrajectoryGroup([reply("42"), reply("41")], metadata={"scenario_id": "s"}))
    assert judged.failure is None and [t.reward for t in judged.group.trajectories] == [1.0, 0.0]


def test_the_operator_setting_names_functions_fully():
    assert Settings(_env_file=None, grader_functions=f" {REGISTERED} ,").grader_functions == [REGISTERED]
    with pytest.raises(ValueError, match=r"grader functions are 'package.module:function', not \['tests.judges'\]"):
        Settings(_env_file=None, grader_functions="tests.judges")
