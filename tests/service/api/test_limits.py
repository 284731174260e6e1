"""The body-size limit on a real loopback server: declared and streamed (chunked) bodies past it get 413."""

from __future__ import annotations

import socket

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
    detail = f"request body larger than the limit of {MAX_BODY_BYTES} bytes (ARTSVC_MAX_BODY_BYTES)"
    assert response.json() == {"detail": detail}


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


def read_response(sock: socket.socket) -> bytes:
    """One HTTP response off ``sock``: its head, and a body of its Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the connection mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = int(next(line.split(b":")[1] for line in lines if line.startswith(b"content-length")))
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize("chunked", [False, True], ids=["declared", "chunked"])
def test_an_oversized_body_on_a_reused_connection_gets_its_413(live_server, auth, chunked):
    """The second request of a keep-alive connection sends a body past the limit: the client reads the 413 (not a
    connection reset from unread bytes), and the server closes the connection after it."""
    host, port = live_server.removeprefix("http://").split(":")
    body = b"x" * (64 * MAX_BODY_BYTES)  # more than the server reads ahead: some arrives after its answer
    framing = b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) if chunked else (
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    authorization = auth()["Authorization"].encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
        assert read_response(sock).startswith(b"HTTP/1.1 200")
        sock.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: test\r\nAuthorization: " + authorization + b"\r\n" + framing)
        response = read_response(sock)
        assert response.startswith(b"HTTP/1.1 413") and b"larger than the limit" in response
        assert b"connection: close" in response.lower()
        assert sock.recv(65536) == b""  # closed cleanly, after the response

