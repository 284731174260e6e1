"""Checkpoints where the transformers backend writes them, for job rows made here, without training: real PEFT
adapters of the tiny LM (tests/tiny_lm.py) whose LoRA weights are random, so they change the logits."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.backends import layout
from service.settings import Settings
from service.spec import JobSpec
from service.store import runs

MODEL_NAME = "demo"
TOKENS = [[1, 42, 7, 1999, 5, 300, 12, 8]]  # a fixed input whose logits the adapters are compared on


@dataclass(frozen=True)
class Adapter:
    folder: Path  # the adapter as peft saved it, with the tokenizer beside it
    logits: object  # torch.Tensor: base + adapter on TOKENS


def make_adapter(base: Path, folder: Path, *, seed: int = 1) -> Adapter:
    """A LoRA of ``base`` with random (non-zero) weights, saved to ``folder`` with the base's tokenizer."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base))
    peft = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", init_lora_weights=False)).eval()
    peft.save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(base)).save_pretrained(folder)
    return Adapter(folder, logits_of(peft))


def exported_names(adapter: Adapter) -> set[str]:
    """The adapter's files that leave the server: all but PEFT's model card, which names the base by its path."""
    return set(os.listdir(adapter.folder)) - {"README.md"}


def logits_of(model) -> object:
    import torch

    with torch.no_grad():
        return model(input_ids=torch.tensor(TOKENS)).logits


def new_job(engine: Engine, *, owner_id: str, backend: str = "transformers", base_model: str = "tiny") -> str:
    """A job row as a transformers-backend job would have it (the spec as stored, JSON)."""
    with Session(engine) as session:
        job = runs.create_job(session, spec=JobSpec(environment="math"), owner_id=owner_id)
        job.spec = {**job.spec, "model": {"name": MODEL_NAME, "backend": backend, "base_model": base_model}}
        session.add(job)
        session.commit()
        return job.id


def checkpoint_dir(settings: Settings, job_id: str, step: int) -> Path:
    """Where the backend writes step ``step`` of the job (service/backends/layout.py)."""
    model_dir = layout.model_dir(layout.models_root(settings.data_dir), layout.job_model_name(job_id, MODEL_NAME))
    return layout.checkpoint_dir(model_dir, step)


def place(adapter: Adapter, settings: Settings, job_id: str, step: int) -> Path:
    """A copy of ``adapter`` as the job's checkpoint of ``step``."""
    target = checkpoint_dir(settings, job_id, step)
    shutil.copytree(adapter.folder, target)
    return target
