"""artsvc worker verbs (being written)."""
