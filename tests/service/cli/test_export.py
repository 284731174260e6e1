"""``artsvc export`` as a user runs it: a subprocess downloading a checkpoint from the real API on loopback into
DIR/adapter and, with --merge, writing DIR/merged, a plain Hugging Face model with the adapter's logits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.databases import sqlite_only
from tests.service import adapter_checkpoints as ckpt
from tests.service.api import seeding

pytestmark = sqlite_only  # the command line's side of things: the API's store is tested in tests/service/api


def artsvc(*args: str, cwd: Path, api_url: str, token: str) -> subprocess.CompletedProcess:
    """``python -m service ARGS`` with the API's URL and token in the environment, as a user sets them."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}
    env.update(ARTSVC_API_URL=api_url, ARTSVC_TOKEN=token, HF_HUB_OFFLINE="1")
    argv = [sys.executable, "-m", "service", *args]
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)


def said(result: subprocess.CompletedProcess) -> str:
    return " ".join(result.stderr.split())


@pytest.fixture(scope="module")
def adapter(tiny_lm, tmp_path_factory) -> ckpt.Adapter:
    return ckpt.make_adapter(tiny_lm, tmp_path_factory.mktemp("adapter") / "adapter")


@pytest.fixture
def job(engine, settings, adapter) -> tuple[str, str]:
    """A transformers job with checkpoints at steps 0 and 2 (the best): its id and its owner's token."""
    owner, headers = seeding.principal(engine)
    job_id = ckpt.new_job(engine, owner_id=owner)
    for step, accuracy in [(0, 0.1), (2, 0.5)]:
        seeding.record(engine, job_id, step, accuracy=accuracy)
        ckpt.place(adapter, settings, job_id, step)
    return job_id, headers["Authorization"].removeprefix("Bearer ")


def test_export_merge_writes_the_adapter_and_a_merged_model_with_the_same_logits(
    live_server, job, adapter, tiny_lm, tmp_path
):
    from transformers import AutoModelForCausalLM

    job_id, token = job
    result = artsvc("export", job_id, "-o", "out", "--merge", "--base-model", str(tiny_lm), cwd=tmp_path,
                    api_url=live_server, token=token)  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert result.stdout.splitlines()[-1] == "out"
    assert "step 2 to out/adapter" in said(result) and "wrote the merged model" in said(result)
    assert sorted(p.name for p in out.iterdir()) == ["adapter", "merged"]
    assert set(os.listdir(out / "adapter")) == ckpt.exported_names(adapter)
    recorded = json.loads((out / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    assert recorded == tiny_lm.name  # the base directory's name, not the server's path

    merged_files = set(os.listdir(out / "merged"))
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= merged_files
    assert not any(name.startswith("adapter") for name in merged_files)  # a plain model: no PEFT needed
    merged = AutoModelForCausalLM.from_pretrained(str(out / "merged")).eval()
    assert torch.allclose(ckpt.logits_of(merged), adapter.logits, atol=1e-4)


def test_a_dir_that_is_not_empty_is_refused_unless_force(live_server, job, tmp_path):
    job_id, token = job
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = artsvc("export", job_id, "-o", "out", cwd=tmp_path, api_url=live_server, token=token)
    assert result.returncode == 2 and "out is not empty" in said(result) and "--force" in said(result)
    assert os.listdir(out) == ["keep.txt"]

    (out / "merged").mkdir()  # a merge of an earlier export: replaced, as it no longer matches the adapter
    result = artsvc("export", job_id, "-o", "out", "--step", "0", "--force", cwd=tmp_path, api_url=live_server,
                    token=token)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(out)) == ["adapter", "keep.txt"] and (out / "keep.txt").read_text() == "mine"
    assert "step 0" in said(result)

    result = artsvc("export", job_id, "-o", "out", "--step", "9", "--force", cwd=tmp_path, api_url=live_server,
                    token=token)  # fmt: skip
    assert result.returncode == 2 and "no checkpoint at step 9" in said(result)
    assert sorted(os.listdir(out)) == ["adapter", "keep.txt"]  # a failed download keeps the earlier export


def test_merge_says_when_the_base_model_is_not_here_and_takes_base_model(
    live_server, engine, settings, adapter, tiny_lm, tmp_path
):
    owner, headers = seeding.principal(engine)
    token = headers["Authorization"].removeprefix("Bearer ")
    job_id = ckpt.new_job(engine, owner_id=owner)
    folder = ckpt.place(adapter, settings, job_id, 1)
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "/srv/models/base"}))

    run = dict(cwd=tmp_path, api_url=live_server, token=token)
    result = artsvc("export", job_id, "--step", "latest", "-o", "out", "--merge", **run)
    assert result.returncode == 2 and "'base' is not a model directory here" in said(result)
    assert "--base-model" in said(result) and "/srv/models" not in said(result)
    out = tmp_path / "out"
    assert (out / "adapter" / "adapter_config.json").is_file() and not (out / "merged").exists()

    result = artsvc("export", job_id, "-o", "out2", "--merge", "--base-model", "nowhere", **run)
    assert result.returncode == 2 and "--base-model nowhere is not a Hugging Face model directory" in said(result)
    assert not (tmp_path / "out2").exists()  # refused before anything was written

    result = artsvc("export", job_id, "--step", "1", "-o", "out", "--force", "--merge", "--base-model", str(tiny_lm),
                    **run)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (out / "merged" / "model.safetensors").is_file()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--step", "first"], "--step must be best, latest or a step number"),
        (["--step", "7"], "has no checkpoint at step 7"),
        (["--base-model", "x"], "--base-model is for --merge"),
    ],
)
def test_refusals_exit_2_with_a_reason_and_write_nothing(args, message, live_server, job, tmp_path):
    job_id, token = job
    result = artsvc("export", job_id, "-o", "out", *args, cwd=tmp_path, api_url=live_server, token=token)
    assert result.returncode == 2 and message in said(result) and "Traceback" not in said(result)
    assert not (tmp_path / "out").exists()


def test_an_embedded_job_is_refused_with_the_apis_reason(live_server, engine, tmp_path):
    owner, headers = seeding.principal(engine)
    job_id = ckpt.new_job(engine, owner_id=owner, backend="embedded")
    result = artsvc("export", job_id, "-o", "out", cwd=tmp_path, api_url=live_server,
                    token=headers["Authorization"].removeprefix("Bearer "))  # fmt: skip
    assert result.returncode == 2 and "embedded backend" in said(result) and "(HTTP 409)" in said(result)
