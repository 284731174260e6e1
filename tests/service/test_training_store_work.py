"""A training step's work in the store is the same at every step: a fixed number of statements and a bounded
number of rows read, however long the job has run (a real job on the embedded backend, on SQLite and PostgreSQL)."""

from __future__ import annotations

from collections import defaultdict

import pytest
from sqlalchemy import event
from sqlalchemy.orm import Mapper
from sqlmodel import Session

from service.runner.control import JobHooks, StopCheck
from service.spec import JobSpec
from service.store import runs
from service.training.loop import run_job

STEPS = 18
RUN = {
    "environment": "math",
    "model": {"base_model": "embedded/char-gpt-0.2m"},
    "training": {"warm_start_examples": 0, "max_steps": STEPS, "groups_per_step": 1, "group_size": 2},
    "validation": {"every_n_steps": 3, "max_examples": 2, "patience": 100},
    # the smallest windows, so the rules' reads are at their full size after a few steps; alerts that
    # cannot fire on this job are made impossible (a step that fires one writes it: more statements)
    "alerts": {"divergence_window": 2, "reward_plateau_steps": 2, "judge_agreement_window": 1, "reward_jump": 10,
               "kl_threshold": 100},
    "seed": 3,
}  # fmt: skip


class StoreWork:
    """Statements executed and ORM rows loaded, bucketed into the intervals between "step" events; each interval
    is everything from the end of one step to the end of the next (validation, control, the step's writes)."""

    def __init__(self) -> None:
        self.current: dict[str, int] = defaultdict(int)
        self.intervals: list[dict[str, int]] = []

    def statement(self, *_: object) -> None:
        self.current["statements"] += 1

    def loaded(self, *_: object) -> None:
        self.current["rows"] += 1

    def on_event(self, kind: str, data: dict) -> None:
        if kind in ("validation", "alert"):
            self.current[kind] += 1
        if kind == "step":
            self.intervals.append({"step": data["step"], **self.current})
            self.current = defaultdict(int)


@pytest.mark.asyncio
async def test_every_step_costs_the_store_the_same_however_long_the_job(engine, tmp_path, monkeypatch):
    # a long phase reads the cancel flag once a second (StopCheck): statements by the clock, not by the step, and a
    # step slower than a second on a loaded machine made one more (a CI flake); here it is read at step boundaries
    monkeypatch.setattr(StopCheck.__init__, "__kwdefaults__", {"store_every_s": float("inf")})
    with Session(engine) as session:
        job_id = runs.create_job(session, spec=JobSpec.model_validate(RUN)).id
        session.commit()
    work = StoreWork()
    event.listen(engine, "before_cursor_execute", work.statement)
    event.listen(Mapper, "load", work.loaded)
    try:
        job = await run_job(job_id, db=engine, data_dir=tmp_path / "data", hooks=JobHooks(on_event=work.on_event))
    finally:
        event.remove(Mapper, "load", work.loaded)
        event.remove(engine, "before_cursor_execute", work.statement)
    assert job.step == STEPS

    quiet = [i for i in work.intervals[1:] if not i.get("alert")]  # the first follows start-up; an alert is a write
    for validated in (False, True):
        same_kind = [i for i in quiet if bool(i.get("validation")) == validated]
        assert len({i["statements"] for i in same_kind}) == 1, same_kind
    # rows read: the same as one validation cycle earlier (the rules read back to a validation point), once the
    # rules' windows are full
    rows = {i["step"]: i["rows"] for i in quiet if i["step"] > STEPS // 2}
    cycle = RUN["validation"]["every_n_steps"]
    pairs = [(rows[step - cycle], rows[step]) for step in rows if step - cycle in rows]
    assert len(pairs) >= 3 and all(early == late for early, late in pairs), rows
