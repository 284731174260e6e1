"""A job's checkpoints through the real API on loopback: the list with validation accuracies and the best step (SQLite
and PostgreSQL), and one step's PEFT adapter as a .tar.gz that PEFT loads with the logits it was saved with; other
tenants' jobs are 404, embedded jobs 409, bad steps 422 or 404, and nothing outside a checkpoint directory leaks."""

from __future__ import annotations

import io
import json
import tarfile

import httpx
import pytest
import torch

from service.store.tables import Role
from tests.databases import sqlite_only
from tests.service import adapter_checkpoints as ckpt
from tests.service.api import seeding


@pytest.fixture(scope="module")
def adapter(tiny_lm, tmp_path_factory) -> ckpt.Adapter:
    return ckpt.make_adapter(tiny_lm, tmp_path_factory.mktemp("adapter") / "adapter")


@pytest.fixture
def owned(engine) -> tuple[str, dict[str, str]]:
    """A client token: its id and its Authorization header."""
    return seeding.principal(engine)


def fake_adapter(settings, job_id: str, step: int) -> None:
    """A checkpoint directory the list counts as an adapter (what is in it does not matter to the list)."""
    folder = ckpt.checkpoint_dir(settings, job_id, step)
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text("{}")


def test_the_list_has_each_step_on_disk_with_its_accuracies_and_the_best_and_latest_step(
    live_server, engine, settings, owned
):
    owner, headers = owned
    job_id = ckpt.new_job(engine, owner_id=owner)
    seeding.start(engine, job_id)
    for step, accuracy in [(0, 0.2), (1, None), (2, 0.5), (3, None), (4, 0.5), (5, 0.4)]:
        seeding.record(engine, job_id, step, accuracy=accuracy)
    for step in (0, 2, 4, 5):  # pruned as training prunes: step 0, the best, the two newest
        fake_adapter(settings, job_id, step)
    (ckpt.checkpoint_dir(settings, job_id, 6).with_name(".0006.tmp")).mkdir()  # a checkpoint being written

    listed = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints", headers=headers).json()
    assert (listed["job_id"], listed["backend"], listed["base_model"]) == (job_id, "transformers", "tiny")
    assert listed["best_step"] == 2 and listed["latest_step"] == 5  # best so far: highest, earliest on ties
    assert [(c["step"], c["accuracy"], c["format"], c["exportable"]) for c in listed["data"]] == [
        (0, 0.2, "peft_adapter", True), (2, 0.5, "peft_adapter", True), (4, 0.5, "peft_adapter", True),
        (5, 0.4, "peft_adapter", True),
    ]  # fmt: skip

    seeding.finish(engine, job_id)  # records best_step = the job's step (5): what the job row says wins
    assert httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints", headers=headers).json()["best_step"] == 5


def test_a_step_validated_without_greedy_or_not_at_all_shows_null(live_server, engine, settings, owned):
    owner, headers = owned
    job_id = ckpt.new_job(engine, owner_id=owner)
    seeding.record(engine, job_id, 0, accuracy=0.25)  # seeding records no greedy accuracy
    fake_adapter(settings, job_id, 0)
    fake_adapter(settings, job_id, 1)
    data = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints", headers=headers).json()["data"]
    assert [(c["accuracy"], c["greedy_accuracy"]) for c in data] == [(0.25, None), (None, None)]


def test_a_queued_job_has_no_checkpoints_and_no_best_step(live_server, engine, owned):
    owner, headers = owned
    job_id = ckpt.new_job(engine, owner_id=owner)
    listed = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints", headers=headers).json()
    assert (listed["data"], listed["best_step"], listed["latest_step"]) == ([], None, None)
    response = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/latest/adapter", headers=headers)
    assert response.status_code == 404 and "has no checkpoint yet" in response.json()["detail"]


@sqlite_only
def test_another_tenants_job_is_404_as_if_it_did_not_exist_and_an_operator_sees_it(
    live_server, engine, settings, owned, adapter
):
    owner, _ = owned
    job_id = ckpt.new_job(engine, owner_id=owner)
    ckpt.place(adapter, settings, job_id, 0)
    _, stranger = seeding.principal(engine)
    _, operator = seeding.principal(engine, Role.operator)
    unknown = "0b6c0b1e-0000-4000-8000-000000000000"
    for path in ("checkpoints", "checkpoints/0/adapter", "checkpoints/latest/adapter"):
        theirs = httpx.get(f"{live_server}/v1/jobs/{job_id}/{path}", headers=stranger)
        missing = httpx.get(f"{live_server}/v1/jobs/{unknown}/{path}", headers=stranger)
        assert theirs.status_code == missing.status_code == 404
        assert theirs.json()["detail"].replace(job_id, unknown) == missing.json()["detail"]
        assert httpx.get(f"{live_server}/v1/jobs/{job_id}/{path}").status_code == 401
    assert httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/0/adapter", headers=operator).status_code == 200


@sqlite_only
def test_an_embedded_job_lists_its_pt_files_as_not_exportable_and_refuses_a_download_with_409(
    live_server, engine, settings, owned
):
    owner, headers = owned
    job_id = ckpt.new_job(engine, owner_id=owner, backend="embedded", base_model="embedded/char-gpt-0.2m")
    folder = ckpt.checkpoint_dir(settings, job_id, 0).parent
    folder.mkdir(parents=True)
    for step in (0, 1):
        (folder / f"{step:04d}.pt").write_bytes(b"not a real checkpoint")
    listed = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints", headers=headers).json()
    assert listed["backend"] == "embedded"
    listing = [(c["step"], c["format"], c["exportable"]) for c in listed["data"]]
    assert listing == [(0, "embedded", False), (1, "embedded", False)]
    for step in ("1", "latest", "best", "7"):
        response = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/{step}/adapter", headers=headers)
        assert response.status_code == 409, step
        assert "embedded backend" in response.json()["detail"] and "not PEFT adapters" in response.json()["detail"]


@sqlite_only
def test_a_downloaded_adapter_loads_with_peft_and_gives_the_logits_it_was_saved_with(
    live_server, engine, settings, owned, adapter, tiny_lm, tmp_path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    owner, headers = owned
    job_id = ckpt.new_job(engine, owner_id=owner)
    for step, accuracy in [(0, 0.1), (3, 0.6), (4, 0.3)]:
        seeding.record(engine, job_id, step, accuracy=accuracy)
        ckpt.place(adapter, settings, job_id, step)

    response = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/best/adapter", headers=headers)
    assert response.status_code == 200 and response.headers["content-type"] == "application/gzip"
    assert response.headers["checkpoint-step"] == "3"
    folder = f"demo-{job_id[:8]}-step0003"
    assert response.headers["content-disposition"] == f'attachment; filename="{folder}.tar.gz"'
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
        names = set(tar.getnames())
        tar.extractall(tmp_path, filter="data")
    assert {f"{folder}/adapter_config.json", f"{folder}/adapter_model.safetensors", f"{folder}/tokenizer.json"} <= names
    assert names == {folder} | {f"{folder}/{name}" for name in ckpt.exported_names(adapter)}

    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_lm)), str(tmp_path / folder))
    loaded.eval()
    base = AutoModelForCausalLM.from_pretrained(str(tiny_lm)).eval()
    assert torch.allclose(ckpt.logits_of(loaded), adapter.logits, atol=1e-5)
    assert not torch.allclose(ckpt.logits_of(base), adapter.logits, atol=1e-3)  # the adapter matters

    latest = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/latest/adapter", headers=headers)
    assert latest.headers["checkpoint-step"] == "4"
    assert httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/0004/adapter", headers=headers).headers[
        "checkpoint-step"] == "4"  # fmt: skip


@sqlite_only
@pytest.mark.parametrize(("base_model", "hub_id"), [("SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
                                                    ("HuggingFaceTB/SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
                                                    ("tiny", None)])  # fmt: skip
def test_a_download_holds_no_training_state_and_names_its_base_without_the_servers_path(
    base_model, hub_id, live_server, engine, settings, owned, adapter, tiny_lm
):
    owner, headers = owned
    job_id = ckpt.new_job(engine, owner_id=owner, base_model=base_model)
    folder = ckpt.place(adapter, settings, job_id, 1)
    (folder / "optimizer.pt").write_bytes(bytes(4096))  # what the engine saves to resume training
    response = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/1/adapter", headers=headers)
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
        names = {name.split("/", 1)[-1] for name in tar.getnames()}
        config = json.load(tar.extractfile(f"demo-{job_id[:8]}-step0001/adapter_config.json"))
    assert names & {"optimizer.pt", "README.md"} == set() and "adapter_model.safetensors" in names
    assert config["base_model_name_or_path"] == (hub_id or tiny_lm.name)  # else the base directory's own name
    assert str(tiny_lm.parent) not in json.dumps(config)
    on_disk = json.loads((folder / "adapter_config.json").read_text())
    assert on_disk["base_model_name_or_path"] == str(tiny_lm)  # what the server serves from is left as it was
    assert {k: v for k, v in config.items() if k != "base_model_name_or_path"} == {
        k: v for k, v in on_disk.items() if k != "base_model_name_or_path"}


@sqlite_only
def test_links_in_a_checkpoint_are_not_followed_and_stray_files_are_left_out(
    live_server, engine, settings, owned, adapter, tmp_path
):
    owner, headers = owned
    job_id = ckpt.new_job(engine, owner_id=owner)
    folder = ckpt.place(adapter, settings, job_id, 1)
    secret = tmp_path / "secret.txt"
    secret.write_text("the operator's secret")
    (folder / "notes.txt").symlink_to(secret)
    (folder / ".hidden").write_text("a temporary file")
    (folder / "nested").mkdir()
    (folder / "nested" / "file.txt").write_text("not an adapter file")
    elsewhere = tmp_path / "elsewhere"
    ckpt.place(adapter, settings, job_id, 2).rename(elsewhere)
    ckpt.checkpoint_dir(settings, job_id, 2).symlink_to(elsewhere)  # a whole checkpoint that is a link

    listed = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints", headers=headers).json()
    assert [c["step"] for c in listed["data"]] == [1]
    response = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/1/adapter", headers=headers)
    with tarfile.open(fileobj=io.BytesIO(response.content), mode="r:gz") as tar:
        names = {name.split("/", 1)[-1] for name in tar.getnames()}
    assert names - {f"demo-{job_id[:8]}-step0001"} == ckpt.exported_names(adapter)
    assert httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/2/adapter", headers=headers).status_code == 404


@sqlite_only
@pytest.mark.parametrize(
    ("step", "status"),
    [("abc", 422), ("-1", 422), ("1.5", 422), ("1e3", 422), ("%D9%A3", 422), ("BEST", 422), (" 1", 422),
     ("12345678901", 422), ("4294967296", 422), ("9", 404), ("best", 404), ("..", 404), ("%2E%2E", 422),
     ("1%2F..", 404)],
)  # fmt: skip
def test_a_bad_step_is_422_and_a_step_without_a_checkpoint_404(step, status, live_server, engine, settings, owned):
    owner, headers = owned
    job_id = ckpt.new_job(engine, owner_id=owner)
    fake_adapter(settings, job_id, 1)  # no validation point: no best step
    response = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/{step}/adapter", headers=headers)
    assert response.status_code == status, response.text


@sqlite_only
def test_a_directory_without_adapter_config_is_listed_but_refused_with_409(live_server, engine, settings, owned):
    owner, headers = owned
    job_id = ckpt.new_job(engine, owner_id=owner)
    ckpt.checkpoint_dir(settings, job_id, 3).mkdir(parents=True)
    listed = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints", headers=headers).json()
    assert [(c["step"], c["format"], c["exportable"]) for c in listed["data"]] == [(3, "other", False)]
    response = httpx.get(f"{live_server}/v1/jobs/{job_id}/checkpoints/3/adapter", headers=headers)
    assert response.status_code == 409 and "not a PEFT adapter" in response.json()["detail"]


@sqlite_only
def test_both_routes_are_in_the_openapi_schema(live_server):
    paths = httpx.get(f"{live_server}/openapi.json").json()["paths"]
    listed = paths["/v1/jobs/{job_id}/checkpoints"]["get"]["responses"]["200"]["content"]
    assert listed["application/json"]["schema"] == {"$ref": "#/components/schemas/CheckpointList"}
    served = paths["/v1/jobs/{job_id}/checkpoints/{step}/adapter"]["get"]["responses"]
    assert "application/gzip" in served["200"]["content"] and {"404", "409"} <= set(served)
