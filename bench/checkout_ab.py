"""What the benches that compare two checkouts of this service share: each side runs in its own child process that
imports that checkout's code (with this venv), in a scratch data directory that links this checkout's converted
base model, and rounds alternate before and after, so both sides see the same machine minute by minute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ENV = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1"}


def child_arguments() -> list[str] | None:
    """In a child (``--child CHECKOUT ... OUT``): its checkout put first on the path, and the arguments after it (the
    last is where its result goes). None in the parent."""
    if len(sys.argv) < 2 or sys.argv[1] != "--child":
        return None
    sys.path.insert(0, sys.argv[2])
    return sys.argv[3:]


def write_result(arguments: list[str], result: dict) -> None:
    Path(arguments[-1]).write_text(json.dumps(result))


def run_child(script: str, checkout: Path, *arguments: str) -> dict:
    """``script`` as a child of ``checkout``: its result."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = [sys.executable, script, "--child", str(checkout), *arguments, out.name]
        subprocess.run(command, cwd=checkout, env={**os.environ, **ENV}, check=True)
        return json.loads(Path(out.name).read_text())


def alternate(
    before: Path, after: Path, rounds: int, cache: Path, side: Callable[[Path, Path], dict],
    report: Callable[[str, dict], None],
) -> dict[str, list[dict]]:  # fmt: skip
    """``rounds`` results of each side, before then after a round: ``side(checkout, data)``, with ``data`` a fresh
    scratch directory whose ``cache`` links this checkout's; ``report`` prints each as it comes."""
    results: dict[str, list[dict]] = {"before": [], "after": []}
    for _ in range(rounds):
        for name, checkout in (("before", before), ("after", after)):
            with tempfile.TemporaryDirectory() as scratch:
                data = Path(scratch)
                (data / "cache").symlink_to(cache.resolve())
                results[name].append(side(checkout.resolve(), data))
            report(name, results[name][-1])
    return results
