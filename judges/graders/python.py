"""``python``: a reward function from an installed module, ``"package.module:callable"``, run in its own process.

The client names a function the operator installed; it never sends source. Each call runs in a fresh interpreter
(``_python_child.py``, given this process's ``sys.path``) in its own process group, so a function that hangs is killed
with everything it started at ``timeout_s`` (which counts the interpreter's start, about 50 ms, and the module's
import), and one that crashes or leaks cannot touch the service. sample and item reach it as JSON.

The function is called as ``f(sample, item)`` and returns a number or ``{"reward": number, "details": {...}}``. A
non-number, a non-finite number, an exception, a crash or a timeout is an error result; a finite number outside
[0, 1] is clamped, and details say so and keep the raw value. A module that cannot be found is a config error at
build time; a missing callable in a module that exists is an error result at grade time (finding it would mean
importing the module, which runs its code, into the service).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import signal
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from judges.graders.base import Grader, GradeResult, GraderModel, clamp, describe, finite_number

VERSION = "python-1.0.0"  # bump when calling, validating or clamping changes (the function's own changes are its own)

CHILD = Path(__file__).with_name("_python_child.py")
FUNCTION_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"


class PythonConfig(GraderModel):
    type: Literal["python"]
    function: str = Field(pattern=FUNCTION_PATTERN, description="'package.module:callable', importable here")
    timeout_s: float = Field(default=5.0, gt=0.0, le=60.0, description="the call is killed after this long")

    @field_validator("function")
    @classmethod
    def _module_is_installed(cls, function: str) -> str:
        module = function.partition(":")[0]
        try:
            found = importlib.util.find_spec(module) is not None  # imports the parent packages, not the module
        except (ImportError, ValueError):  # a parent package is missing, or is not a package
            found = False
        if not found:
            raise ValueError(f"module {module!r} is not installed")
        return function


class PythonGrader(Grader):
    """The named function's reward for the sample, computed in a separate process under a time limit."""

    def __init__(self, config: PythonConfig) -> None:
        super().__init__(config.name, VERSION)
        self.config = config

    async def _grade(self, sample: dict, item: dict) -> GradeResult:
        try:
            request = json.dumps({"path": sys.path, "function": self.config.function, "sample": sample, "item": item})
        except (TypeError, ValueError) as exc:
            return self.error(f"sample and item must be JSON: {describe(exc)}")
        answer = await self._call(request.encode())
        if "error" in answer:
            return self.error(answer["error"], function=self.config.function)
        raw = finite_number(answer.get("reward"))
        if raw is None:
            return self.error(f"{self.config.function} returned {answer.get('reward')!r}, not a finite number")
        details = {"function": self.config.function, "function_details": answer.get("details")}
        reward = clamp(raw)
        if reward != raw:
            details |= {"raw_reward": raw, "clamped": True}
            return self.result(reward, f"{self.config.function} returned {raw}, clamped into [0, 1]", **details)
        return self.result(reward, f"{self.config.function} returned {raw}", **details)

    async def _call(self, request: bytes) -> dict:
        """The child's answer: {"reward", "details"} or {"error"}; the process group is killed if it is still there."""
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable, str(CHILD), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        except OSError as exc:  # out of processes or file descriptors
            return {"error": f"could not start a process for {self.config.function}: {describe(exc)}"}
        try:
            stdout, _ = await asyncio.wait_for(process.communicate(request), timeout=self.config.timeout_s)
        except TimeoutError:
            return {"error": f"{self.config.function} did not return within {self.config.timeout_s} s"}
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
            return {"error": f"{self.config.function}'s process exited with code {process.returncode} and no answer"}
        return answer if isinstance(answer, dict) else {"error": f"unreadable answer {lines[-1][:200]!r}"}
