"""ART's own client, unmodified, trains here: ``art.ServerlessBackend`` and ``art.TrainableModel`` against the real API
served on loopback and a real worker process, on the tiny test model. Rollouts go through ``model.openai_client()``
(logprobs come back unasked), two ``backend.train`` calls give steps 1 and 2, named steps are served, and
``delete_checkpoints`` keeps the newest; another tenant gets 404 everywhere; malformed batches are 422s naming the
field; a batch with nothing to train fails with its reason; a batch of agent size is taken."""

from __future__ import annotations

import asyncio
import json

import art
import httpx
import openai
import pytest

from service.store.tables import Role
from tests.databases import sqlite_only
from tests.service.api import seeding

pytestmark = [sqlite_only, pytest.mark.timeout(300)]

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Say a colour."}]


@pytest.fixture
def settings(settings, tiny_lm):
    """The tests' settings, letting client tokens train the tiny model, with room for a batch of agent size."""
    return settings.model_copy(update={"client_base_models": [str(tiny_lm)], "client_batch_max_bytes": 16 * 1024 * 1024})


@pytest.fixture
def worker(start_worker):
    return start_worker()


async def rollouts(model: art.TrainableModel, *, groups: int = 2, size: int = 4) -> list[art.TrajectoryGroup]:
    """The user's rollouts: a reply sampled from the model's newest checkpoint, rewarded by its place in the group (so
    every group has an advantage)."""
    client = model.openai_client()

    async def rollout(i: int) -> art.Trajectory:
        completion = await client.chat.completions.create(
            model=model.get_inference_name(), messages=MESSAGES, max_tokens=8, temperature=1.0  # type: ignore[arg-type]
        )
        return art.Trajectory(messages_and_choices=[*MESSAGES, completion.choices[0]], reward=float(i))

    return await art.gather_trajectory_groups(
        [art.TrajectoryGroup(rollout(i) for i in range(size)) for _ in range(groups)], pbar_desc=None
    )


def test_an_unmodified_art_script_registers_samples_trains_twice_and_prunes_its_checkpoints(
    live_server, engine, tiny_lm, worker, monkeypatch
):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    _, headers = seeding.principal(engine)
    key = headers["Authorization"].removeprefix("Bearer ")

    async def script() -> None:
        backend = art.ServerlessBackend(base_url=f"{live_server}/v1", api_key=key)
        model = art.TrainableModel(name="agent", project="demo", base_model=str(tiny_lm))
        await model.register(backend)
        assert model.id and model.entity
        assert await model.get_step() == 0
        groups = await rollouts(model)
        choice = groups[0].trajectories[0].messages_and_choices[-1]
        assert choice.logprobs is not None and choice.logprobs.content[0].token.startswith("token_id:")  # unasked

        first = await backend.train(model, groups, learning_rate=1e-3)
        assert first.step == 1 and await model.get_step() == 1
        assert any("loss" in key for key in first.metrics), first.metrics
        second = await backend.train(model, await rollouts(model), learning_rate=1e-3)
        assert second.step == 2

        again = art.TrainableModel(name="agent", project="demo", base_model=str(tiny_lm))
        await again.register(backend)
        assert again.id == model.id  # registering again returns the existing model

        client = model.openai_client()
        named = await client.chat.completions.create(model=model.get_inference_name(step=1), messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]
        assert named.model.endswith(":step1")
        with pytest.raises(openai.NotFoundError):
            await client.chat.completions.create(model=model.get_inference_name(step=7), messages=MESSAGES, max_tokens=4)  # type: ignore[arg-type]

        await model.delete_checkpoints()
        steps = [c.step async for c in backend._client.models.checkpoints.list(model_id=model.id)]
        assert steps == [2]
        await backend.close()

    asyncio.run(script())


def test_another_tenant_gets_not_found_everywhere(live_server, engine, tiny_lm, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    _, mine = seeding.principal(engine, name="mine")
    _, theirs = seeding.principal(engine, name="theirs")
    body = {"entity": None, "project": "demo", "name": "agent", "base_model": str(tiny_lm), "return_existing": True}
    with httpx.Client(base_url=f"{live_server}/v1/preview", timeout=30) as http:
        model = http.post("/models", json=body, headers=mine).json()
        batch = {"model_id": model["id"], "trajectory_groups": [_group()], "experimental_config": {}}
        job = http.post("/training-jobs", json=batch, headers=mine).json()
        for method, path, payload in [
            ("GET", f"/models/{model['id']}/checkpoints", None),
            ("DELETE", f"/models/{model['id']}/checkpoints", {"steps": [0]}),
            ("POST", "/training-jobs", batch),
            ("GET", f"/training-jobs/{job['id']}/events", None),
            ("DELETE", f"/models/{model['id']}", None),
        ]:
            refused = http.request(method, path, json=payload, headers=theirs)
            assert refused.status_code == 404, (method, path, refused.text)
            assert "error" in refused.json()
        for cursor in ("9" * 20, "-1", "x"):  # an event id past any integer column, or none
            assert http.get(f"/training-jobs/{job['id']}/events", params={"after": cursor}, headers=mine).status_code == 422
        # their own model of the same name is another model
        assert http.post("/models", json=body, headers=theirs).json()["id"] != model["id"]
    sampled = openai.OpenAI(base_url=f"{live_server}/v1", api_key=theirs["Authorization"].split()[1], max_retries=0)
    with pytest.raises(openai.NotFoundError):
        sampled.chat.completions.create(model=f"wandb-artifact:///artsvc/demo/agent-{model['id'][:4]}", messages=MESSAGES)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (lambda b: b.pop("model_id"), "model_id"),
        (lambda b: b.update(trajectory_groups=[]), "trajectory_groups"),
        (lambda b: b["trajectory_groups"][0]["trajectories"][1].update(reward="high"), "trajectory_groups[0].trajectories[1].reward"),
        (lambda b: b["trajectory_groups"][0]["trajectories"][0]["messages_and_choices"].append({"rol": "user"}),
         "trajectory_groups[0].trajectories[0].messages_and_choices[3].role"),
        (lambda b: b["trajectory_groups"][0]["trajectories"][0]["messages_and_choices"][2].update(index="x"),
         "trajectory_groups[0].trajectories[0].messages_and_choices[2].index"),
        (lambda b: b["experimental_config"].update(learning_rate=-1), "learning_rate"),
    ],
)
def test_a_malformed_batch_is_refused_naming_its_first_bad_field(client, engine, tiny_lm, settings, change, named):
    _, headers = seeding.principal(engine)
    model = client.post("/v1/preview/models", headers=headers, json={"project": "p", "name": "m", "base_model": str(tiny_lm)}).json()
    batch = {"model_id": model["id"], "trajectory_groups": [_group()], "experimental_config": {}}
    change(batch)
    refused = client.post("/v1/preview/training-jobs", headers=headers, json=batch)
    assert refused.status_code == 422, refused.text
    assert named in refused.json()["error"]["message"]
    assert not any(p.name.startswith(".incoming") for p in (settings.data_dir / "client-batches").iterdir())


def test_a_base_model_the_operator_does_not_allow_is_refused(client, engine):
    _, headers = seeding.principal(engine)
    refused = client.post("/v1/preview/models", headers=headers, json={"project": "p", "name": "m", "base_model": "/etc"})
    assert refused.status_code == 422 and "ARTSVC_CLIENT_BASE_MODELS" in refused.json()["error"]["message"]


def test_a_batch_with_nothing_to_train_fails_with_its_reason_and_a_batch_of_agent_size_is_taken(
    live_server, engine, tiny_lm, worker
):
    _, headers = seeding.principal(engine)
    with httpx.Client(base_url=f"{live_server}/v1/preview", timeout=60, headers=headers) as http:
        model = http.post("/models", json={"project": "p", "name": "m", "base_model": str(tiny_lm)}).json()
        unsampled = _group()
        for trajectory in unsampled["trajectories"]:
            trajectory["messages_and_choices"][-1]["logprobs"] = None  # a reply sampled elsewhere: never trainable
        job = http.post("/training-jobs", json={"model_id": model["id"], "trajectory_groups": [unsampled]}).json()
        events = _wait_for_end(http, job["id"])
        assert [e["type"] for e in events] == ["training_started", "training_failed"]
        assert "no trajectory has an assistant Choice with logprobs" in events[-1]["data"]["error_message"]

        flat = _group(rewards=(0.5, 0.5))  # no advantage this step: it advances unchanged, as ART's LocalBackend does
        events = _wait_for_end(http, http.post("/training-jobs", json={"model_id": model["id"], "trajectory_groups": [flat]}).json()["id"])
        assert [e["type"] for e in events] == ["training_started", "gradient_step", "training_ended"]
        assert events[1]["data"]["zero_variance_groups"] == 1.0 and events[-1]["data"]["step"] == 1

        big = [_group() for _ in range(4)]  # about 10 MiB, as a multi-turn agent's batch: its bulk in the rollouts' logs
        for group in big:
            for trajectory in group["trajectories"]:
                trajectory["logs"] = ["tool output " + "x" * 100_000] * 13
        body = json.dumps({"model_id": model["id"], "trajectory_groups": big}).encode()
        assert len(body) > 8 * 1024 * 1024
        taken = http.post("/training-jobs", content=body, headers={"Content-Type": "application/json"})
        assert taken.status_code == 200, taken.text
        assert _wait_for_end(http, taken.json()["id"])[-1]["type"] == "training_ended"

        too_long = _group(extra=[{"role": "user", "content": "word " * 9000}])  # past the 8,192 tokens a row may hold
        events = _wait_for_end(http, http.post("/training-jobs", json={"model_id": model["id"], "trajectory_groups": [too_long]}).json()["id"])
        assert events[-1]["type"] == "training_failed" and "tokens" in events[-1]["data"]["error_message"]


def _wait_for_end(http: httpx.Client, job_id: str, *, within_s: float = 240) -> list[dict]:
    import time

    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        events = http.get(f"/training-jobs/{job_id}/events").json()["data"]
        if events and events[-1]["type"] in ("training_ended", "training_failed"):
            return events
        time.sleep(0.5)
    raise AssertionError(f"training job {job_id} did not end in {within_s} s")


def _group(*, rewards: tuple[float, ...] = (0.0, 1.0), extra: list[dict] | None = None) -> dict:
    """A group as ART's client dumps it: replies as Choices with ``token_id:N`` logprobs."""
    choice = {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": "red"},
              "logprobs": {"content": [{"token": "token_id:1001", "bytes": None, "logprob": -1.5, "top_logprobs": []},
                                       {"token": "token_id:2", "bytes": None, "logprob": -0.5, "top_logprobs": []}]}}  # fmt: skip
    trajectories = [{"messages_and_choices": [*MESSAGES, *(extra or []), choice], "reward": reward} for reward in rewards]
    return {"trajectories": trajectories, "exceptions": [], "metadata": {}, "metrics": {}, "logs": []}


def test_a_worker_killed_mid_batch_is_taken_over_and_no_step_is_lost_or_taken_twice(
    live_server, engine, tiny_lm, start_worker, settings
):
    import shutil
    import time

    from sqlmodel import Session, select

    from service.backends import layout
    from service.store.tables import ClientModel, TrainingStep

    _, headers = seeding.principal(engine)
    with httpx.Client(base_url=f"{live_server}/v1/preview", timeout=60, headers=headers) as http:
        model = http.post("/models", json={"project": "p", "name": "m", "base_model": str(tiny_lm)}).json()
        doomed = start_worker()
        job = http.post("/training-jobs", json={"model_id": model["id"], "trajectory_groups": [_group(), _group()]}).json()
        deadline = time.monotonic() + 120
        while not http.get(f"/training-jobs/{job['id']}/events", params={"wait": 0}).json()["data"]:  # it is claimed
            assert time.monotonic() < deadline, doomed.log()
            time.sleep(0.05)
        doomed.process.kill()  # kill -9, wherever it was
        doomed.process.wait()
        taker = start_worker()
        assert _wait_for_end(http, job["id"])[-1]["type"] == "training_ended"
        taker.process.kill()  # the next batch starts cold (a worker keeps the model it trained last loaded)
        taker.process.wait()
        start_worker()

        # a crash after the checkpoint was written but before the step was recorded leaves a checkpoint past the record
        with Session(engine) as session:
            series_id = session.exec(select(ClientModel.job_id).where(ClientModel.id == model["id"])).one()
        folder = layout.model_dir(layout.models_root(settings.data_dir), layout.job_model_name(series_id, "m"))
        shutil.copytree(layout.checkpoint_dir(folder, 1), layout.checkpoint_dir(folder, 2))
        listed = http.get(f"/models/{model['id']}/checkpoints").json()["data"]
        assert [c["step"] for c in listed] == [0, 1]  # what the store has not recorded is not a checkpoint
        second = http.post("/training-jobs", json={"model_id": model["id"], "trajectory_groups": [_group()]}).json()
        ended = _wait_for_end(http, second["id"])
        assert ended[-1]["type"] == "training_ended" and ended[-1]["data"]["step"] == 2
        listed = http.get(f"/models/{model['id']}/checkpoints", params={"order": "desc", "limit": 1}).json()
        assert [c["step"] for c in listed["data"]] == [2] and listed["has_more"]
        assert "loss" in listed["data"][0]["metrics"]
    with Session(engine) as session:
        steps = session.exec(select(TrainingStep.step).where(TrainingStep.job_id == series_id)).all()
    assert sorted(steps) == [1, 2]


def test_the_readme_example_trains_against_artsvc_serve(engine, tiny_lm, tmp_path):
    """README's "Train your own agent from ART" script, as it is, against `artsvc serve --local` and its worker."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.service.processes import ServeProcess, environment

    env = environment(database_url=engine.url.render_as_string(hide_password=False), data_dir=tmp_path / "data")
    server = ServeProcess(env=env, log_path=tmp_path / "serve.log")
    try:
        script = Path(__file__).parents[3] / "examples" / "train_from_art.py"
        run = subprocess.run([sys.executable, str(script)], env={**env, "ARTSVC_API_URL": server.url, "BASE_MODEL": str(tiny_lm)},
                             cwd=tmp_path, capture_output=True, text=True, timeout=240)  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:] + server.log()
        assert "step 1:" in run.stdout and "step 2:" in run.stdout, run.stdout
    finally:
        server.process.terminate()
        server.process.wait(timeout=60)


def test_a_registered_model_is_listed_and_streams_the_completion_it_answers(live_server, engine, tiny_lm):
    """Before any training the base model answers (step 0); `stream=True` gives the same greedy reply in chunks."""
    _, headers = seeding.principal(engine)
    key = headers["Authorization"].removeprefix("Bearer ")
    with httpx.Client(base_url=f"{live_server}/v1/preview", timeout=60, headers=headers) as http:
        http.post("/models", json={"entity": "me", "project": "p", "name": "m", "base_model": str(tiny_lm)}).raise_for_status()
    client = openai.OpenAI(base_url=f"{live_server}/v1", api_key=key, max_retries=0, timeout=120)
    name = "wandb-artifact:///me/p/m"
    assert name in [model.id for model in client.models.list()]
    whole = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=12, temperature=0)  # type: ignore[arg-type]
    assert whole.model == name + ":step0" and whole.choices[0].logprobs is not None
    streamed = client.chat.completions.create(model=name, messages=MESSAGES, max_tokens=12, temperature=0, stream=True)  # type: ignore[arg-type]
    parts = list(streamed)
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == whole.choices[0].message.content
    assert [p.choices[0].finish_reason for p in parts if p.choices][-1] == whole.choices[0].finish_reason


def test_a_model_named_after_an_environment_is_validated_and_stops_on_its_plateau(live_server, engine, tiny_lm, worker):
    """Project "math": the base model's point before the first step, a point after each due step, the plateau rule
    (min_delta 1.0: no gain can count), then no more training jobs, with the reason."""
    from sqlmodel import Session, select

    from service.store.tables import ClientModel, Job, ValidationPoint

    _, headers = seeding.principal(engine)
    validation = {"every_n_steps": 1, "max_examples": 2, "patience": 1, "min_delta": 1.0}
    with httpx.Client(base_url=f"{live_server}/v1/preview", timeout=60, headers=headers) as http:
        model = http.post("/models", json={"project": "math", "name": "m", "base_model": str(tiny_lm),
                                           "validation": validation}).json()  # fmt: skip
        job = http.post("/training-jobs", json={"model_id": model["id"], "trajectory_groups": [_group()]}).json()
        assert _wait_for_end(http, job["id"])[-1]["type"] == "training_ended"
        refused = http.post("/training-jobs", json={"model_id": model["id"], "trajectory_groups": [_group()]})
        assert refused.status_code == 409 and "plateau" in refused.json()["error"]["message"]
    with Session(engine) as session:
        series = session.get(Job, session.exec(select(ClientModel.job_id).where(ClientModel.id == model["id"])).one())
        points = session.exec(select(ValidationPoint.step).where(ValidationPoint.job_id == series.id)).all()
    assert sorted(points) == [0, 1] and series.status == "succeeded" and series.stop_reason == "plateau"
    assert series.environment == "math" and model["run_id"] == series.id


def test_a_queued_batch_and_a_model_are_cancelled_through_the_jobs_api(client, engine, tiny_lm):
    """No worker runs: the queued batch ends at once with the training_failed its client waits for; cancelling the
    model's series ends its training, and further batches are refused with the reason."""
    _, headers = seeding.principal(engine)
    model = client.post("/v1/preview/models", headers=headers, json={"project": "p", "name": "m", "base_model": str(tiny_lm)}).json()
    batch = {"model_id": model["id"], "trajectory_groups": [_group()]}
    job = client.post("/v1/preview/training-jobs", headers=headers, json=batch).json()
    assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=headers).json()["status"] == "cancelled"
    events = client.get(f"/v1/preview/training-jobs/{job['id']}/events", headers=headers).json()["data"]
    assert [e["type"] for e in events] == ["training_failed"] and "cancelled" in events[0]["data"]["error_message"]
    assert client.post(f"/v1/jobs/{model['run_id']}/cancel", headers=headers).json()["status"] == "cancelled"
    refused = client.post("/v1/preview/training-jobs", headers=headers, json=batch)
    assert refused.status_code == 409 and "cancelled" in refused.json()["error"]["message"]


def test_an_events_request_is_held_until_its_batch_ends_and_past_the_callers_stream_cap_answers_at_once(
    live_server, engine, tiny_lm, settings
):
    """No worker runs, so the batch stays queued until it is cancelled: a request for its events is held (ART's client
    asks once a second, and hears of the end when it happens), and the cancel ends the hold at once, not at its 10 s.
    Held requests count as the caller's live event streams: past the cap, the page comes back at once."""
    import threading
    import time

    _, headers = seeding.principal(engine)
    with httpx.Client(base_url=f"{live_server}/v1", timeout=60, headers=headers) as http:
        model = http.post("/preview/models", json={"project": "p", "name": "m", "base_model": str(tiny_lm)}).json()
        batch = {"model_id": model["id"], "trajectory_groups": [_group()]}
        job = http.post("/preview/training-jobs", json=batch).json()
        events = f"/preview/training-jobs/{job['id']}/events"
        assert http.get(events, params={"wait": 0}).json() == {"data": [], "has_more": False}
        started = time.monotonic()
        assert http.get(events, params={"wait": 0.5}).json()["data"] == []  # held for its 0.5 s: nothing came
        assert time.monotonic() - started >= 0.5

        cap = settings.max_event_streams_per_tenant
        hold = {"params": {"wait": 10}}
        holders = [threading.Thread(target=http.get, args=(events,), kwargs=hold) for _ in range(cap)]
        for holder in holders:
            holder.start()
        time.sleep(2.0)  # every slot of this caller is held now
        started = time.monotonic()
        # not held (no slot left): a held request would wait its default 10 s, the batch never ending without a worker
        assert http.get(events).json()["data"] == [] and time.monotonic() - started < 6.0
        for holder in holders:
            holder.join()

        threading.Timer(1.0, lambda: http.post(f"/jobs/{job['id']}/cancel")).start()
        started = time.monotonic()
        ended = http.get(events).json()["data"]  # held until the cancel ends the batch, 1 s from now
        assert [e["type"] for e in ended] == ["training_failed"] and 0.9 <= time.monotonic() - started < 8.0


def test_a_batch_past_its_byte_limit_is_refused_before_it_is_read_whole(engine, settings, tiny_lm):
    from fastapi.testclient import TestClient

    from service.app import create_app

    small = settings.model_copy(update={"client_batch_max_bytes": 4096})
    _, headers = seeding.principal(engine)
    with TestClient(create_app(small, engine=engine), base_url="http://localhost") as http:
        model = http.post("/v1/preview/models", headers=headers, json={"project": "p", "name": "m", "base_model": str(tiny_lm)}).json()
        body = {"model_id": model["id"], "trajectory_groups": [_group(extra=[{"role": "user", "content": "x" * 8192}])]}
        refused = http.post("/v1/preview/training-jobs", headers=headers, json=body)
        assert refused.status_code == 413 and "ARTSVC_CLIENT_BATCH_MAX_BYTES" in refused.text
        small_enough = {"model_id": model["id"], "trajectory_groups": [_group()]}
        assert http.post("/v1/preview/training-jobs", headers=headers, json=small_enough).status_code == 200
    assert not [p for p in (settings.data_dir / "client-batches").iterdir() if p.name.startswith(".incoming")]


def test_the_posted_experimental_config_reaches_arts_loss_and_packing(client, engine, settings, tiny_lm, monkeypatch):
    """The batch's run, in this process: ART's loss gets the posted options (and the learning rate its step), packing
    the advantage balance."""
    from service.art_client.runner import WARM, run_client_batch
    from service.backends.transformers import engine as policy_engine
    from service.backends.transformers import training

    seen: dict = {}
    grpo_step, pack = training.grpo_step, training.pack

    def grpo_seen(*args, **kwargs):  # the real step, its arguments kept
        seen.update(config=kwargs["config"], learning_rate=kwargs["learning_rate"])
        return grpo_step(*args, **kwargs)

    def pack_seen(*args, **kwargs):
        seen.update(advantage_balance=kwargs["advantage_balance"])
        return pack(*args, **kwargs)

    monkeypatch.setattr(policy_engine.training, "grpo_step", grpo_seen)
    monkeypatch.setattr(policy_engine.training, "pack", pack_seen)
    _, headers = seeding.principal(engine)
    model = client.post("/v1/preview/models", headers=headers, json={"project": "p", "name": "m", "base_model": str(tiny_lm)}).json()
    config = {"learning_rate": 2e-5, "ppo": True, "epsilon": 0.1, "epsilon_high": 0.3, "importance_sampling_level": "sequence",
              "advantage_balance": 0.5, "scale_rewards": False, "max_negative_advantage_importance_sampling_weight": 2.0,
              "mask_prob_ratio": True, "kimi_k2_tau": None, "precalculate_logprobs": False}  # ART always sends every key
    job = client.post("/v1/preview/training-jobs", headers=headers,
                      json={"model_id": model["id"], "trajectory_groups": [_group()], "experimental_config": config}).json()

    async def run():
        try:
            return await run_client_batch(job["id"], db=engine, data_dir=settings.data_dir, settings=settings)
        finally:
            await WARM.close()  # the model it kept loaded for a next batch

    ended = asyncio.run(run())
    assert ended.status == "succeeded", ended.error
    assert seen["learning_rate"] == 2e-5 and seen["advantage_balance"] == 0.5
    assert {k: seen["config"][k] for k in ("ppo", "epsilon", "epsilon_high", "importance_sampling_level",
                                           "max_negative_advantage_importance_sampling_weight", "mask_prob_ratio")} == {
        "ppo": True, "epsilon": 0.1, "epsilon_high": 0.3, "importance_sampling_level": "sequence",
        "max_negative_advantage_importance_sampling_weight": 2.0, "mask_prob_ratio": True}  # fmt: skip
    assert "kimi_k2_tau" not in seen["config"]  # unset: ART's default


def test_text_the_store_would_refuse_is_refused_when_posted(client, engine):
    _, headers = seeding.principal(engine)
    refused = client.post("/v1/preview/models", headers=headers, json={"project": "p", "name": "m", "base_model": "a\x00b"})
    assert refused.status_code == 422, refused.text
    model = client.post("/v1/preview/models", headers=headers, json={"project": "p", "name": "m", "base_model": "SmolLM2-135M-Instruct"}).json()
    group = _group(extra=[{"role": "user", "content": "nul \x00 here"}])
    refused = client.post("/v1/preview/training-jobs", headers=headers, json={"model_id": model["id"], "trajectory_groups": [group]})
    assert refused.status_code == 422 and "NUL" in refused.json()["error"]["message"]
