"""artsvc serve verbs (being written)."""
