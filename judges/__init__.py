"""Judges: what scores a trajectory group when the environment's own verifier does not (a job's reward mode).

RULER (``ruler.py``) ranks a group with an LLM judge; a grader (``graders/``, OpenAI-style configs) grades each
final reply against its scenario (``grading.py``). Both return a ``GroupJudgement`` (``judgement.py``), the contract
the training loop reads, and are held to the job's judge budget (``usage.py``). Each LLM judge's prompt is a text
file beside its module.
"""
