"""The inference process as the API starts it: a child of its own at the workers' CPU policy with bounded torch
threads, started again when it dies, killed and replaced when it answers nothing long past the deadline, and gone
when its parent dies (kill -9 included). No model is loaded: a checkpoint that does not exist is answered 404."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from service import inference
from service.backends.openai_server import ChatCompletionRequest, ServingError
from service.inference.process import InferenceProcess
from service.settings import Settings

MISSING = {
    "folder": "/nonexistent/checkpoint", "default_max_tokens": 1,
    "members": [{"model": "job@1", "request": {"model": "job@1", "messages": [{"role": "user", "content": "hi"}]}}],
    "bounds": {"max_prompt_tokens": 64, "max_completion_tokens": 64, "deadline_s": 1.0},
}  # fmt: skip
ROOT = Path(__file__).resolve().parents[3]


def ask(process: InferenceProcess) -> dict:
    async def reply() -> dict:
        _, answer = process.submit(MISSING)
        return await answer

    return asyncio.run(reply())


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")  # a zombie has ended
    except FileNotFoundError:
        return True


def wait_for(condition, within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    while not condition():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.02)


@pytest.mark.skipif(sys.platform != "linux", reason="SCHED_IDLE and /proc are Linux's")
def test_a_child_at_the_workers_cpu_policy_with_bounded_threads_started_again_when_it_dies(tmp_path):
    settings = Settings(_env_file=None, data_dir=tmp_path, worker_cpu_policy="idle", inference_threads=3)
    process = InferenceProcess.of(settings)
    try:
        assert process.pid is None  # started on first use
        assert ask(process)["error"]["code"] == "model_not_found"
        first = process.pid
        assert first is not None and first != os.getpid()
        assert os.sched_getscheduler(first) == os.SCHED_IDLE
        assert b"OMP_NUM_THREADS=3" in Path(f"/proc/{first}/environ").read_bytes().split(b"\0")

        os.kill(first, signal.SIGKILL)
        wait_for(lambda: process.pid is None)
        assert ask(process)["error"]["code"] == "model_not_found"
        assert process.pid not in (None, first)
    finally:
        process.close()


@pytest.mark.skipif(sys.platform != "linux", reason="the parent-death signal is Linux's")
def test_the_child_dies_with_its_parent():
    script = ("from service.inference.process import InferenceProcess\n"
              "process = InferenceProcess(cpu_policy='nice', nice=0, threads=1)\n"
              "process.start()\nprint(process.pid, flush=True)\nimport time; time.sleep(60)\n")  # fmt: skip
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert not gone(child)
    finally:
        parent.kill()
        parent.wait()
    wait_for(lambda: gone(child), within_s=5)


def test_a_child_that_answers_nothing_is_killed_past_the_deadline_and_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(inference, "STUCK_S", 0.5)
    settings = Settings(_env_file=None, data_dir=tmp_path, worker_cpu_policy="nice", inference_deadline_s=0.5)
    engine = inference.InferenceEngine(settings)
    request = ChatCompletionRequest.model_validate(MISSING["members"][0]["request"])

    async def status() -> int:
        try:
            await engine.complete(Path(MISSING["folder"]), request, model="job@1", tenant="t")
        except ServingError as exc:
            return exc.status
        raise AssertionError("answered")

    try:
        engine.process.start()
        stuck = engine.process.pid
        os.kill(stuck, signal.SIGSTOP)
        started = time.monotonic()
        assert asyncio.run(status()) == 503 and time.monotonic() - started < 5
        assert gone(stuck) and not engine.turns.held
        assert asyncio.run(status()) == 404  # a new child answers
    finally:
        engine.close()


def test_the_model_the_process_serves_loads_without_art():
    """The inference process serves base models and trained checkpoints and never trains: importing its model module
    (torch and transformers) must not import ART, whose import (litellm, ART's modules) a process start would pay."""
    from art.types import Tools

    from service.backends.transformers import chat
    from service.inference.child import MODEL_MODULE

    assert chat.TOOLS == Tools  # the tool lists of trajectories, typed as ART types them
    probe = (f"import importlib, json, sys; importlib.import_module({MODEL_MODULE!r}); "
             "print(json.dumps([m for m in ('torch', 'transformers', 'art', 'litellm') if m in sys.modules]))")  # fmt: skip
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.splitlines()[-1]) == ["torch", "transformers"]
