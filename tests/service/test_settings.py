"""Settings a newcomer never sets: the data directory, relative by default, is made absolute once, when read."""

from __future__ import annotations

from pathlib import Path

import pytest

from service.settings import Settings


@pytest.mark.parametrize("given", [None, ".artsvc", "data/../store"])
def test_the_data_directory_is_absolute_whatever_is_given(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ARTSVC_DATA_DIR", raising=False)
    settings = Settings(_env_file=None) if given is None else Settings(_env_file=None, data_dir=Path(given))
    expected = tmp_path / {None: ".artsvc", ".artsvc": ".artsvc", "data/../store": "store"}[given]
    assert settings.data_dir == expected  # a path made from it stays right after the working directory changes
    assert settings.resolved_database_url == f"sqlite:///{expected / 'artsvc.db'}"
