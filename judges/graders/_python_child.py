"""One python-grader call (see sandbox.py): a JSON request on stdin, one JSON answer line on stdout.

Run by path, not as part of the package, so it starts without importing the service. The address-space limit is set
before the function's module is imported, so its import counts too. The function's own prints go to stderr, which
the grader discards, so nothing it prints can be read as the answer.
"""

import importlib
import json
import numbers
import resource
import sys


def answer(request: dict) -> dict:
    """{"reward": value, "details": ...} or {"error": why}; the grader checks that the value is a finite number."""
    function_name = request["function"]
    module_name, _, attribute = function_name.partition(":")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
        value = function(request["sample"], request["item"])
    except MemoryError:
        return {"error": f"{function_name} ran out of memory (the limit is ARTSVC_GRADER_MEMORY_MB)"}
    except Exception as exc:  # noqa: BLE001 -- reported to the grader as the call's error
        return {"error": f"{function_name} raised {type(exc).__name__}: {exc}"[:500]}
    details = None
    if isinstance(value, dict):
        value, details = value.get("reward"), value.get("details")
    if isinstance(value, numbers.Real) and not isinstance(value, int):  # a numpy or Fraction number becomes a float
        value = float(value)
    return {"reward": value, "details": details}


def main() -> None:
    request = json.loads(sys.stdin.buffer.read())
    limit = request["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    sys.path[:] = request["path"]  # the service's own path: the function is importable here as it is there
    answer_stream, sys.stdout = sys.stdout, sys.stderr
    result = answer(request)
    try:
        line = json.dumps(result, default=repr)
    except ValueError as exc:  # circular details
        line = json.dumps({"error": f"{request['function']} returned details that are not JSON: {exc}"})
    answer_stream.write(line + "\n")


if __name__ == "__main__":
    main()
