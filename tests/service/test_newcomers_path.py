"""The README's path from the main job to a served model, as a newcomer takes it from a fresh clone: ``artsvc train
--env math`` with the defaults (a relative data directory, the default base model), ``artsvc export --local --merge``
with no server (merged into the base the job trained on), then ``artsvc serve --local`` and a chat completion through
the official ``openai`` client and through ``artsvc chat``.

Kept fast: the default base model's converted directory in the data directory's cache is the tiny LM
(tests/tiny_lm.py, same tokenizer), placed where the conversion of SmolLM2's GGUF file would be, and the run is one
step of one group of two."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from service.backends.transformers.models import DEFAULT_BASE_MODEL, SMOLLM2_HUB_ID, converted_dir, smollm2_gguf
from service.cli import app
from service.settings import get_settings

TINY_RUN = ["--max-steps", "1", "--groups-per-step", "1", "--group-size", "2", "--val-examples", "2",
            "--warm-start-examples", "0", "--no-greedy"]  # fmt: skip


@pytest.fixture
def clone(tiny_lm, tmp_path) -> Path:
    """A fresh working directory whose default data directory (.artsvc) already holds the default base model."""
    fresh = tmp_path / "clone"
    shutil.copytree(tiny_lm, converted_dir(smollm2_gguf(), fresh / ".artsvc" / "cache" / "base-models",
                                           slug=DEFAULT_BASE_MODEL))  # fmt: skip
    return fresh


@pytest.fixture
def artsvc(clone, monkeypatch) -> Callable[..., Result]:
    """``artsvc ARGS`` in this process (the real typer app, whose torch and ART are loaded already), in the fresh
    clone with no ARTSVC_ setting at all."""
    for name in [name for name in os.environ if name.startswith("ARTSVC_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(clone)
    get_settings.cache_clear()
    yield lambda *args: CliRunner().invoke(app, list(args))
    get_settings.cache_clear()


def fresh_environment() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ARTSVC_")}, "HF_HUB_OFFLINE": "1"}


@pytest.mark.timeout(300)
def test_train_then_export_locally_then_chat_through_the_openai_client(artsvc, clone):
    import openai

    trained = artsvc("train", "--env", "math", *TINY_RUN, "--json")
    assert trained.exit_code == 0, trained.output
    assert "val " in trained.output and "greedy" not in trained.output  # --no-greedy: each example played once
    job_id = json.loads(trained.stdout.splitlines()[-1])["id"]

    unreachable = artsvc("export", job_id, "-o", "out", "--api-url", "http://127.0.0.1:9")  # no server runs
    assert unreachable.exit_code == 2 and "exports with --local" in unreachable.stderr
    exported = artsvc("export", job_id, "-o", "out", "--local", "--merge")
    assert exported.exit_code == 0, exported.output
    assert (clone / "out" / "merged" / "model.safetensors").is_file()  # merged into the base the job trained on
    adapter = clone / "out" / "adapter"
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= set(os.listdir(adapter))
    assert "optimizer.pt" not in os.listdir(adapter)
    assert not any(str(clone).encode() in path.read_bytes() for path in adapter.iterdir())  # no path of this machine
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == SMOLLM2_HUB_ID

    server = subprocess.Popen([sys.executable, "-m", "service", "serve", "--local", "--port", "0", "--no-worker"],
                              cwd=clone, env=fresh_environment(), stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        url = listening_url(server)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="local mode needs none", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model=job_id, messages=[{"role": "user", "content": "What is 2 + 3?"}], max_tokens=4
        )
        assert reply.model.startswith(job_id) and isinstance(reply.choices[0].message.content, str)
        chatted = artsvc("chat", job_id, "What is 2 + 3?", "--max-tokens", "4", "--api-url", url)
        assert chatted.exit_code == 0 and reply.model in chatted.stderr, chatted.output
        refused = artsvc("chat", job_id, "hi", "--step", "9", "--api-url", url)  # OpenAI's error envelope, read
        assert refused.exit_code == 2 and "has no checkpoint at step 9" in refused.stderr and "(HTTP 404)" in refused.stderr
    finally:
        server.send_signal(signal.SIGTERM)
        server.communicate(timeout=60)


def listening_url(server: subprocess.Popen) -> str:
    """The URL ``artsvc serve`` announces on stderr once it listens."""
    line = ""
    while "listening on" not in line:
        line = server.stderr.readline()
        assert line, "artsvc serve exited before listening"
    return line.split("listening on ")[1].split()[0]
