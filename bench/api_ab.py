"""Benchmark: two revisions of the API under the same closed-loop load, alternated, so the ratio is measured in one run.

A change to the request path is judged against the revision before it on the same machine at the same time:
these machines are noisy (the same closed loop varies by 1.5x run to run), so each round runs ``BASE`` then
``HEAD`` (``git worktree`` checkouts, imported from their own folder with this environment's packages), each as
``artsvc serve --no-worker`` on a fresh SQLite store with one job queued, loaded by ``bench/http_load.py`` with
50 connections back to back, every ``--post-every``-th request a ``POST /v1/jobs``. Reported: the median over
rounds of throughput and of each endpoint's p50 and p99, and HEAD / BASE.

    python bench/api_ab.py BASE [HEAD] [--rounds 3] [--seconds 15] [--post-every 10] [--database-url URL]
                           [--head-api-processes N]

``--head-api-processes N`` serves HEAD with ``serve --api-processes N``: ``api_ab.py HEAD HEAD --head-api-processes 2``
compares one API process with two on the same code.

``--database-url`` takes a PostgreSQL server URL: each load then gets a fresh database on that server, dropped after.

Writes ``bench/results/api_ab.json`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from api_load import QUEUED_SPEC, Server, cli  # noqa: E402
from env_rl import machine  # noqa: E402
from store_per_step import postgres_database  # noqa: E402


@contextlib.contextmanager
def checkout(revision: str) -> Iterator[Path]:
    """``revision`` in a temporary worktree, removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="artsvc-ab-")) / "tree"
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(folder), revision], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(folder)], check=True)


def revision(name: str) -> str:
    """``name`` with the commit it names, e.g. ``HEAD~1 (ccb942f)``."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", name], check=True, capture_output=True, text=True)
    return f"{name} ({sha.stdout.strip()})"


def closed_loop(tree: Path, args: argparse.Namespace, *, api_processes: int = 1) -> dict[str, Any]:
    """One closed-loop load against ``tree``'s server (``serve --api-processes``): throughput and p50/p99 per
    endpoint."""
    # `python -m service` imports from the current folder first: run in the tree, so its `service` is the one served
    with tempfile.TemporaryDirectory(prefix="artsvc-ab-store-") as store, contextlib.chdir(tree):
        env = {**os.environ, "ARTSVC_DATA_DIR": store, "PYTHONPATH": str(tree)}
        env.pop("ARTSVC_DATABASE_URL", None)
        with contextlib.ExitStack() as stack:
            if args.database_url:
                env["ARTSVC_DATABASE_URL"], drop = postgres_database(args.database_url)
                stack.callback(drop)
            load = _load(env, args, api_processes=api_processes)
    return {
        "requests_per_s": load["requests_per_s"],
        "errors": load["errors"],
        **{f"{name.split()[0]} {q}": stats[q] for name, stats in load["endpoints"].items() for q in ("p50_ms", "p99_ms")},
    }


def _load(env: dict[str, str], args: argparse.Namespace, *, api_processes: int) -> dict[str, Any]:
    """Migrate the store in ``env``, queue one job, and load a server over it: http_load.py's report."""
    cli(env, "db", "upgrade")
    tokens = [cli(env, "token", "create", "--role", "operator", "--name", f"ab-{i}") for i in range(5)]
    processes = ["--api-processes", str(api_processes)] if api_processes != 1 else []  # older revisions lack it
    with Server(env, "--no-worker", *processes) as server:
        headers = {"Authorization": f"Bearer {tokens[0]}"}
        job = httpx.post(f"{server.base}/v1/jobs", json=QUEUED_SPEC, headers=headers, timeout=60).raise_for_status()
        command = [
            sys.executable, str(ROOT / "bench" / "http_load.py"), "--base", server.base, "--tokens", ",".join(tokens),
            "--get-path", f"/v1/jobs/{job.json()['id']}", "--post-body", json.dumps(QUEUED_SPEC),
            "--post-every", str(args.post_every), "--connections", "50", "--seconds", str(args.seconds),
        ]  # fmt: skip
        return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="the revision to compare against, e.g. HEAD~1")
    parser.add_argument("head", nargs="?", default="HEAD")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--post-every", type=int, default=10, help="every n-th request is a POST (0: GETs only)")
    parser.add_argument("--database-url", default=None, help="a PostgreSQL server URL; default: a SQLite file")
    parser.add_argument("--head-api-processes", type=int, default=1, help="serve HEAD with `--api-processes N`")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "api_ab.json")
    args = parser.parse_args()
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
    with checkout(args.base) as base, checkout(args.head) as head:
        for round_ in range(args.rounds):
            for name, tree, processes in (("base", base, 1), ("head", head, args.head_api_processes)):
                runs[name].append(closed_loop(tree, args, api_processes=processes))
                print(f"round {round_ + 1} {name}: {json.dumps(runs[name][-1])}", flush=True)
    medians = {name: {key: statistics.median(run[key] for run in rows) for key in rows[0]} for name, rows in runs.items()}
    ratio = {key: round(medians["head"][key] / medians["base"][key], 2) for key in medians["base"] if medians["base"][key]}
    result = {"base": revision(args.base), "head": revision(args.head), "post_every": args.post_every, "seconds": args.seconds,
              "store": "postgresql" if args.database_url else "sqlite", "head_api_processes": args.head_api_processes,
              "runs": runs, "medians": medians, "head_over_base": ratio, "machine": machine()}  # fmt: skip
    args.out.parent.mkdir(exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"medians": medians, "head_over_base": ratio}, indent=2))


if __name__ == "__main__":
    main()
