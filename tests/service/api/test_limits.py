"""The body-size limit on a real loopback server: declared and streamed (chunked) bodies past it get 413."""

from __future__ import annotations

import httpx
import pytest

from tests.databases import sqlite_only
from tests.service.conftest import MAX_BODY_BYTES

pytestmark = sqlite_only  # plain HTTP behaviour: nothing here depends on the database


@pytest.fixture
def post(live_server, auth):
    headers = {**auth(), "Content-Type": "application/json"}

    def send(content) -> httpx.Response:
        return httpx.post(f"{live_server}/v1/jobs", content=content, headers=headers, timeout=30)

    return send


def test_a_declared_length_past_the_limit_is_refused_unread(post):
    response = post(b"{" + b" " * MAX_BODY_BYTES + b"}")
    assert response.status_code == 413
    assert response.json() == {"detail": f"request body larger than the limit of {MAX_BODY_BYTES} bytes"}


def test_a_chunked_body_is_counted_as_it_streams(post):
    def chunks():
        yield b'{"environment": "math", "pad": "'
        for _ in range(8):
            yield b"x" * (MAX_BODY_BYTES // 4)
        yield b'"}'

    response = post(chunks())
    assert response.status_code == 413 and "larger than the limit" in response.json()["detail"]


def test_a_chunked_body_within_the_limit_is_served(post):
    def chunks():
        yield b'{"environment": '
        yield b'"math"}'

    assert post(chunks()).status_code == 201


def test_a_body_exactly_at_the_limit_reaches_validation(post):
    body = b'{"environment": "math", "pad": "'
    body += b"x" * (MAX_BODY_BYTES - len(body) - 2) + b'"}'
    response = post(body)
    assert response.status_code == 422 and "pad: Extra inputs are not permitted" in response.json()["detail"]
