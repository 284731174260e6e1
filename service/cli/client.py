"""artsvc client verbs (being written)."""
