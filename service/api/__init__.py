"""The HTTP API's parts: one router per resource under ``routes/``, and what they share (auth, schemas, limits,
errors). service/app.py assembles them into the FastAPI app."""
