"""artsvc tokens verbs (being written)."""
