"""A training job's checkpoints as the API reads them from disk: which steps exist, which are PEFT adapter
directories (the transformers backend's, exportable) and which are the embedded backend's ``.pt`` files (not), and
one adapter streamed as a .tar.gz.

Paths are made from the job's row (its id, and the model name its validated spec carries) and an integer step,
never from request text. Only regular files directly inside a checkpoint directory are served: links are never
followed, subfolders and hidden files are left out. Files are opened before the response starts, so a checkpoint
the training loop prunes while it downloads still arrives whole.

What leaves the server is what a user needs, not what training needs: no optimizer state (nor PEFT's empty model
card), and an ``adapter_config.json`` whose base is a name that means something on another machine
(:func:`portable_base`), never this server's path. The server itself serves the checkpoint directory, which keeps it.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path, PurePath
from typing import BinaryIO

from service.backends import layout
from service.backends.transformers.models import hub_id
from service.store.tables import Job, ValidationPoint

MODEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # ModelSpec.name's pattern, checked again here
FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # what an adapter directory's files are called
MAX_FILES = 64  # an adapter and its tokenizer are about ten files
CHUNK = 1 << 20
GZIP_LEVEL = 1  # weights barely compress: the fastest level gets most of what there is (the tokenizer's text)
ADAPTER_CONFIG = "adapter_config.json"
NOT_EXPORTED = frozenset({
    "optimizer.pt",  # the transformers engine's optimizer state: resumes training, of no use to a user
    "README.md",  # PEFT's empty model card, whose metadata names the server's path to the base
})  # fmt: skip


class CheckpointFormat(str, Enum):
    peft_adapter = "peft_adapter"  # a directory with adapter_config.json: exportable
    embedded = "embedded"  # <step>.pt of the embedded backend's character model
    other = "other"  # a directory without adapter_config.json


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    format: CheckpointFormat

    @property
    def exportable(self) -> bool:
        return self.format is CheckpointFormat.peft_adapter


class NoCheckpoint(LookupError):
    """The step asked for has no checkpoint on disk (or there is no best or latest step yet)."""


class NotExportable(ValueError):
    """The checkpoint is not a PEFT adapter (the embedded backend's, or a directory without adapter_config.json)."""


def job_backend(job: Job) -> str:
    return str((job.spec.get("model") or {}).get("backend") or "transformers")


def job_base_model(job: Job) -> str | None:
    """The base model the job trains from: its manifest's (the environment's default resolved), else its spec's."""
    recorded = ((job.manifest or {}).get("model") or {}).get("base_model")
    return recorded if recorded is not None else (job.spec.get("model") or {}).get("base_model")


def model_dir(job: Job, data_dir: Path) -> Path | None:
    """Where the job's backend writes its checkpoints; None when its spec names no model a path can be made of."""
    name = (job.spec.get("model") or {}).get("name")
    if not isinstance(name, str) or not MODEL_NAME.match(name):
        return None
    return layout.model_dir(layout.models_root(data_dir), layout.job_model_name(job.id, name))


def find(folder: Path | None) -> list[Checkpoint]:
    """The checkpoints in a model directory, oldest first (none if it does not exist)."""
    if folder is None:
        return []
    return [found for step in sorted(set(layout.checkpoint_steps(folder))) if (found := _at(folder, step)) is not None]


def _at(folder: Path, step: int) -> Checkpoint | None:
    path = layout.checkpoint_dir(folder, step)
    if path.is_dir() and not path.is_symlink():
        config = path / ADAPTER_CONFIG
        peft = config.is_file() and not config.is_symlink()
        return Checkpoint(step, path, CheckpointFormat.peft_adapter if peft else CheckpointFormat.other)
    pt = path.with_name(path.name + ".pt")
    if pt.is_file() and not pt.is_symlink():
        return Checkpoint(step, pt, CheckpointFormat.embedded)
    return None


def best_step(job: Job, points: list[ValidationPoint]) -> int | None:
    """The job's best validation step: as recorded when it ended, else the stopping rule's best so far (highest
    accuracy, earliest on ties: service/runner/stopping.py), the step the training loop's pruning keeps."""
    if job.best_step is not None:
        return job.best_step
    return max(points, key=lambda p: (p.accuracy, -p.step)).step if points else None


def pick(found: list[Checkpoint], step: int | str, *, best: int | None) -> Checkpoint:
    """The checkpoint of ``step`` (an integer, ``best`` or ``latest``); NoCheckpoint with the reason if none."""
    if step == "latest":
        if not found:
            raise NoCheckpoint("has no checkpoint yet")
        return found[-1]
    if step == "best":
        if best is None:
            raise NoCheckpoint("has no best step yet (no validation point recorded)")
        step = best
    for checkpoint in found:
        if checkpoint.step == step:
            return checkpoint
    raise NoCheckpoint(f"has no checkpoint at step {step} (steps on disk: {[c.step for c in found] or 'none'})")


@dataclass(frozen=True)
class OpenFile:
    name: str
    file: BinaryIO
    size: int
    mtime: int


def open_adapter(checkpoint: Checkpoint) -> list[OpenFile]:
    """Every regular file directly in an adapter directory, opened (links not followed, at most MAX_FILES).
    NotExportable for a checkpoint that is no PEFT adapter; NoCheckpoint if the directory has gone."""
    if not checkpoint.exportable:
        raise NotExportable(f"step {checkpoint.step}'s checkpoint is {checkpoint.format.value}, not a PEFT adapter")
    opened: list[OpenFile] = []
    try:
        folder = os.open(checkpoint.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        raise NoCheckpoint(f"has no checkpoint at step {checkpoint.step} any more") from None
    try:
        for name in sorted(os.listdir(folder)):
            if not FILE_NAME.match(name) or name in NOT_EXPORTED:
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
            except OSError:  # a link (ELOOP), or gone since listing
                continue
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or len(opened) == MAX_FILES:
                os.close(fd)
                continue
            opened.append(OpenFile(name, os.fdopen(fd, "rb"), info.st_size, int(info.st_mtime)))
    except BaseException:
        close(opened)
        raise
    finally:
        os.close(folder)
    if not any(f.name == ADAPTER_CONFIG for f in opened):
        close(opened)
        raise NoCheckpoint(f"has no checkpoint at step {checkpoint.step} any more")
    return opened


def close(files: list[OpenFile]) -> None:
    for f in files:
        f.file.close()


@dataclass(frozen=True)
class AdapterArchive:
    """One checkpoint's adapter, opened, as it leaves the server: the archive's folder name, the checkpoint, the
    files."""

    folder: str
    checkpoint: Checkpoint
    files: list[OpenFile]

    @property
    def step(self) -> int:
        return self.checkpoint.step

    def chunks(self) -> Iterator[bytes]:
        return tar_gz(self.folder, self.files)


def open_adapter_archive(job: Job, *, data_dir: Path, step: int | str, best: int | None) -> AdapterArchive:
    """The job's checkpoint at ``step`` (see :func:`pick`) as a user takes it away: adapter and tokenizer files, no
    training state, the base named portably. NotExportable for an embedded-backend job or a checkpoint that is no
    PEFT adapter; NoCheckpoint with the reason when there is none at ``step``."""
    if job_backend(job) == "embedded":
        raise NotExportable(
            "its checkpoints are .pt files of artsvc's own character model, not PEFT adapters; only "
            "transformers-backend jobs export"
        )
    folder = model_dir(job, data_dir)
    checkpoint = pick(find(folder), step, best=best)
    files = open_adapter(checkpoint)
    assert folder is not None  # pick found a checkpoint in it
    try:
        files = [_with_portable_base(f, job) if f.name == ADAPTER_CONFIG else f for f in files]
    except BaseException:
        close(files)
        raise
    return AdapterArchive(f"{folder.name}-step{checkpoint.step:04d}", checkpoint, files)


def recorded_base(config: dict) -> str | None:
    """The base model an adapter config names (``base_model_name_or_path``), if it names one."""
    name = config.get("base_model_name_or_path")
    return name if isinstance(name, str) and name else None


def trained_base(checkpoint: Checkpoint) -> Path | None:
    """The base model directory on this machine that the checkpoint's adapter was trained on, as its config records
    it; None when that names no model directory here."""
    try:
        config = json.loads((checkpoint.path / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    recorded = recorded_base(config) if isinstance(config, dict) else None
    return Path(recorded) if recorded and (Path(recorded) / "config.json").is_file() else None


def portable_base(job: Job, recorded: str) -> str:
    """What an exported adapter names as its base: the Hugging Face id of the job's base model where it has one
    (SmolLM2's for the default), else the base directory's own name, a relative path the user points at their copy
    (``artsvc export --merge --base-model``). Never this server's path."""
    return hub_id(job_base_model(job) or "") or PurePath(recorded).name


def _with_portable_base(config_file: OpenFile, job: Job) -> OpenFile:
    """``adapter_config.json`` with its base named by :func:`portable_base`; unchanged if it names none."""
    with config_file.file:
        try:
            config = json.loads(config_file.file.read())
        except ValueError:
            raise NotExportable(f"its {ADAPTER_CONFIG} is not JSON") from None
    if isinstance(config, dict) and (recorded := recorded_base(config)) is not None:
        config["base_model_name_or_path"] = portable_base(job, recorded)
    data = (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()
    return OpenFile(config_file.name, io.BytesIO(data), len(data), config_file.mtime)


def tar_gz(folder: str, files: list[OpenFile]) -> Iterator[bytes]:
    """``files`` as a gzip-compressed tar archive under ``folder/``, in chunks; closes the files when done."""
    gzip = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, 31)  # wbits 31: a gzip header and trailer
    written = 0

    def put(data: bytes) -> bytes:
        nonlocal written
        written += len(data)
        return gzip.compress(data)

    try:
        yield put(_header(folder + "/", tarfile.DIRTYPE, size=0, mtime=max((f.mtime for f in files), default=0)))
        for f in files:
            yield put(_header(f"{folder}/{f.name}", tarfile.REGTYPE, size=f.size, mtime=f.mtime))
            left = f.size  # exactly the size the header promised, even if the file changed since it was opened
            while left > 0:
                data = f.file.read(min(CHUNK, left)) or b""
                if not data:
                    raise OSError(f"{f.name} shrank while it was sent")
                left -= len(data)
                yield put(data)
            yield put(b"\0" * (-f.size % tarfile.BLOCKSIZE))
        end = b"\0" * (2 * tarfile.BLOCKSIZE)
        yield put(end + b"\0" * (-(written + len(end)) % tarfile.RECORDSIZE)) + gzip.flush()
    finally:
        close(files)


def _header(name: str, kind: bytes, *, size: int, mtime: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.mtime = kind, size, mtime
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
