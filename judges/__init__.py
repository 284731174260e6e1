"""Judges that score trajectory groups when no verifier can (RULER and graders).

Empty until the judges work lands: math, the first environment, is scored by its own verifier.
"""
