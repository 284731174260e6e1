"""The judge budget (reward.max_judge_cost_usd) against the scripted judge server on loopback: every call is charged,
failed tries included, and the budget is checked before each call, so a job stops with stop reason ``budget`` having
spent at most its budget plus one call. On SQLite and PostgreSQL (the spend is read back from the store)."""

from __future__ import annotations

from typing import Any

import litellm
import pytest
from sqlmodel import Session

from service.store import runs
from service.store.events import events_after
from service.store.tables import JobStatus, StopReason
from service.training.loop import run_job
from tests.judges.judge_server import Behaviour, _verdict, answers_something, judge_server
from tests.service.test_judged_training import JUDGE, judged, settings_for
from tests.service.worker.conftest import submit

MALFORMED = "no verdict here"
CALL_USD = 1.2e-4  # about what one call of these jobs costs at gpt-4o-mini's price (a group of four short rollouts)


def cost_of(request: dict[str, Any], content: str) -> float:
    """What litellm's price map charges for one of the judge server's answers (it counts tokens the same way)."""
    prompt = litellm.token_counter(model=request["model"], messages=request["messages"])
    completion = litellm.token_counter(model=request["model"], text=content, count_response_tokens=True)
    return sum(litellm.cost_per_token(model=JUDGE, prompt_tokens=prompt, completion_tokens=completion))


def spent(engine, job_id: str) -> float:
    with Session(engine) as session:
        return runs.judge_spent_usd(session, job_id=job_id)


@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_a_budget_spent_mid_step_stops_the_job_within_one_call_of_it(engine, tmp_path):
    budget = 2.5 * CALL_USD  # the first step's two calls, then room for one more
    job_id = submit(engine, judged(max_judge_cost_usd=budget))
    with judge_server() as server:
        job = await run_job(job_id, db=engine, data_dir=tmp_path / "data", settings=settings_for(server, tmp_path))
        costs = [cost_of(r, _verdict(r, answers_something, None)) for r in server.requests]
    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.budget
    assert spent(engine, job_id) == pytest.approx(sum(costs))  # every call charged
    assert budget <= spent(engine, job_id) <= budget + max(costs)
    assert min(costs) > budget / 4 and max(costs) < budget / 2  # CALL_USD still matches the calls' price
    with Session(engine) as session:
        budget_stop = next(e.data for e in events_after(session, job_id=job_id) if e.kind == "finished")
    assert budget_stop["stop_reason"] == "budget"


@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_a_failed_try_is_charged_and_a_retry_past_the_budget_is_not_made(engine, tmp_path):
    job_id = submit(engine, judged(max_judge_cost_usd=1e-9))  # spent by the first call, whatever it costs
    with judge_server([Behaviour(body=MALFORMED)]) as server:  # the first call is paid for and answers nothing usable
        job = await run_job(job_id, db=engine, data_dir=tmp_path / "data", settings=settings_for(server, tmp_path))
        requests = list(server.requests)
    assert len(requests) == 1  # neither its retry nor the step's other group was judged
    assert job.status is JobStatus.succeeded and job.stop_reason is StopReason.budget and job.step == 0
    charged = cost_of(requests[0], MALFORMED)
    assert charged > 0 and spent(engine, job_id) == pytest.approx(charged)  # kept, though no step recorded
    with Session(engine) as session:
        kept = [e for e in events_after(session, job_id=job_id) if e.kind == "judge_spend"]
    assert len(kept) == 1 and kept[0].step == 1 and kept[0].data["judge_dropped_groups"] == 2
    with Session(engine) as session:  # what the job's metrics and cost views show counts it too
        assert runs.cost_totals(session, job_id=job_id)["judge_cost_usd"] == pytest.approx(charged)
        assert runs.judge_totals(session, job_id=job_id)["judge_dropped_groups"] == 2
