"""Echo's reward as a code grader, registered through the ``artsvc.graders`` entry point.

A module of its own, importing nothing heavy: a python grader imports its module in a fresh process for every call.
"""


def exact(sample: dict, item: dict) -> float:
    """1.0 when the reply is exactly the scenario's word."""
    return float(sample["output_text"] == item["word"])
