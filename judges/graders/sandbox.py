"""One call of a registered grader function in a child process: its own process group, a wall-clock timeout, an
address-space limit, an environment without the service's secrets, and a cap on such processes at once.

This contains the operator's own code when it misbehaves (hangs, leaks, crashes, prints); it is no security
boundary against code written to escape, which is why only registered functions run here at all.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import weakref
from pathlib import Path

from judges.graders.base import describe

CHILD = Path(__file__).with_name("_python_child.py")
PASSED_ENV = ("PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "TZ")  # and LC_*
ONE_THREAD = {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}

_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def child_env() -> dict[str, str]:
    """The child's environment: locale, paths and temporary folders of this process, nothing else (no keys,
    tokens, database URLs or ARTSVC_ settings); numeric libraries limited to one thread."""
    kept = {k: v for k, v in os.environ.items() if k in PASSED_ENV or k.startswith("LC_")}
    return {**kept, **ONE_THREAD}


def process_slots(limit: int) -> asyncio.Semaphore:
    """The semaphore every grader call on this event loop with this ``limit`` shares (a worker runs one loop)."""
    per_loop = _slots.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault(limit, asyncio.Semaphore(limit))


async def call(target: str, sample: object, item: object, *, timeout_s: float, memory_mb: int, processes: int) -> dict:
    """``target(sample, item)`` in a child: {"reward", "details"} or {"error": why}. Waits for one of ``processes``
    slots first; the timeout starts with the process. Never raises but for cancellation."""
    try:
        request = json.dumps({"path": sys.path, "function": target, "memory_bytes": memory_mb * 2**20,
                              "sample": sample, "item": item}).encode()  # fmt: skip
    except (TypeError, ValueError) as exc:
        return {"error": f"sample and item must be JSON: {describe(exc)}"}
    async with process_slots(processes):
        return await _run(target, request, timeout_s=timeout_s)


async def _run(target: str, request: bytes, *, timeout_s: float) -> dict:
    try:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-I", str(CHILD), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, start_new_session=True, env=child_env(),
        )  # fmt: skip
    except OSError as exc:  # out of processes or file descriptors
        return {"error": f"could not start a process for {target}: {describe(exc)}"}
    try:
        stdout, _ = await asyncio.wait_for(process.communicate(request), timeout=timeout_s)
    except TimeoutError:
        return {"error": f"{target} did not return within {timeout_s} s"}
    finally:
        if process.returncode is None:  # timed out, or this task was cancelled
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            await process.wait()
    lines = stdout.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        return {"error": f"{target}'s process exited with code {process.returncode} and no answer"}
    return answer if isinstance(answer, dict) else {"error": f"unreadable answer {lines[-1][:200]!r}"}
