"""A downloaded checkpoint on the client's machine: the API's adapter archive unpacked into a PEFT adapter
directory, and that adapter merged into its base model as a plain Hugging Face model directory (safetensors weights,
config, tokenizer) that ``AutoModelForCausalLM.from_pretrained`` and vLLM load without PEFT.

Nothing here imports torch, transformers or PEFT until a merge asks for them; no model code is ever run from a
directory (``trust_remote_code`` stays off) and nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
from pathlib import Path

MAX_MEMBERS = 65  # the API sends one folder and at most 64 files (service/checkpoints.py)


class ExportError(Exception):
    """What stops an export, said so that the user can act on it."""


def unpack(archive: Path, target: Path) -> None:
    """The archive's one folder, extracted as ``target`` (which must not exist): regular files only, inside it."""
    scratch = target.with_name(f".{target.name}.unpack-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            tops = {Path(m.name).parts[0] for m in members if Path(m.name).parts}
            if len(members) > MAX_MEMBERS or len(tops) != 1 or not all(m.isfile() or m.isdir() for m in members):
                raise ExportError(f"the archive from the API is not one adapter folder ({len(members)} entries)")
            tar.extractall(scratch, filter="data")  # refuses absolute paths, '..' and links leading out
        folder = scratch / tops.pop()
        if not (folder / "adapter_config.json").is_file():
            raise ExportError("the archive from the API holds no adapter_config.json")
        folder.rename(target)
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise ExportError(f"cannot unpack the adapter archive: {exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def base_model_dir(adapter: Path, given: Path | None) -> Path:
    """The base model to merge into: ``given``, else the adapter's ``base_model_name_or_path`` (a Hugging Face id or
    a directory's name, relative to here); ExportError if that is not a Hugging Face model directory here."""
    if given is not None:
        if not (given.expanduser() / "config.json").is_file():
            raise ExportError(f"--base-model {given} is not a Hugging Face model directory (no config.json in it)")
        return given.expanduser().resolve()
    try:
        config = json.loads((adapter / "adapter_config.json").read_text(encoding="utf-8"))
        recorded = config.get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as exc:
        raise ExportError(f"cannot read {adapter / 'adapter_config.json'}: {exc}") from None
    if isinstance(recorded, str) and recorded and (Path(recorded) / "config.json").is_file():
        return Path(recorded)
    raise ExportError(
        f"the adapter's base model {recorded!r} is not a model directory here: pass --base-model PATH, a Hugging Face "
        "directory of the same model (config.json, safetensors weights, tokenizer)"
    )


def merge(adapter: Path, base: Path, target: Path) -> None:
    """``base`` with ``adapter`` applied and merged in (``merge_and_unload``), saved as ``target`` (which must not
    exist) with the adapter's tokenizer (the base's if the adapter has none). Written aside and renamed: a failed
    merge leaves no ``target``."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    scratch = target.with_name(f".{target.name}.merge-{os.getpid()}")
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype="auto", local_files_only=True)
        merged = PeftModel.from_pretrained(model, str(adapter), local_files_only=True).merge_and_unload()
        merged.save_pretrained(scratch)  # safetensors
        tokenizer_source = adapter if (adapter / "tokenizer_config.json").is_file() else base
        AutoTokenizer.from_pretrained(str(tokenizer_source), local_files_only=True).save_pretrained(scratch)
        scratch.rename(target)
    except (OSError, ValueError, RuntimeError) as exc:  # unreadable files, a base of another shape
        raise ExportError(f"cannot merge the adapter into {base}: {exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
