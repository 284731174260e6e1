"""The HTTP API: FastAPI app, one router per resource under ``routes/``."""
