"""The training runner: the loop (loop.py) and its parts: warm start, judged steps, validation, the baseline."""
