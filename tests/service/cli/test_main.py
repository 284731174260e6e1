"""``artsvc``'s entry point: importing the packages changes nothing in the process, and ``main()`` sets the
process defaults (litellm's local price map, no tqdm bars) before anything reads them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from service import cli

IMPORTS = """
import os, sys
before = dict(os.environ)
import service.cli
late = [name for name in ("litellm", "tqdm") if name in sys.modules]
assert not late, f"importing the CLI imports {late}: main() would set their environment variables too late"
import environments, environments.email, environments.math, environments.twenty48, judges, judges.graders, service
changed = sorted(set(os.environ.items()) ^ set(before.items()))
assert not changed, f"importing changed the environment: {changed}"
"""


def test_importing_the_packages_sets_nothing_and_the_cli_loads_neither_litellm_nor_tqdm():
    env = {name: value for name, value in os.environ.items() if name not in cli.PROCESS_DEFAULTS}
    result = subprocess.run([sys.executable, "-c", IMPORTS], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_main_sets_the_process_defaults_and_keeps_the_operators_own(monkeypatch):
    monkeypatch.delenv("LITELLM_LOCAL_MODEL_COST_MAP", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", raising=False)
    monkeypatch.setenv("TQDM_DISABLE", "0")  # set by the operator: kept
    monkeypatch.setattr(sys, "argv", ["artsvc", "--help"])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 0
    assert os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] == "True" and os.environ["HF_HUB_OFFLINE"] == "1"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "64"
    assert os.environ["TQDM_DISABLE"] == "0"


LITELLM_IMPORT = """
import socket, sys
asked = []
def refuse(host, *args, **kwargs):
    asked.append(host)
    raise OSError("this test has no network")
socket.getaddrinfo = refuse
if sys.argv[1] == "defaults":
    from service.process_env import apply_process_defaults
    apply_process_defaults()
import litellm  # ART imports it; it reads its price map once, at import
print(asked)
"""


@pytest.mark.parametrize("defaults", ["defaults", "none"])
def test_with_the_process_defaults_importing_litellm_asks_the_network_for_nothing(defaults):
    env = {name: value for name, value in os.environ.items() if name not in cli.PROCESS_DEFAULTS}
    result = subprocess.run([sys.executable, "-c", LITELLM_IMPORT, defaults], env=env, capture_output=True,
                            text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    asked = result.stdout.strip().splitlines()[-1]
    assert (asked == "[]") == (defaults == "defaults"), asked  # without them, litellm looks its price map up
