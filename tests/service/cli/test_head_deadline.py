"""Slow request heads against the protocol ``artsvc serve`` runs (slowloris): a connection that sends nothing, or its
head a byte at a time, is closed once the head deadline passes, while others are served; a kept-alive connection
gets the same deadline for its next request's head."""

from __future__ import annotations

import socket
import time

import httpx

from service.cli.head_deadline import head_timed_protocol
from tests.databases import sqlite_only
from tests.service.conftest import serve

pytestmark = sqlite_only  # plain HTTP behaviour

HEAD_TIMEOUT_S = 0.5


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (whatever it sent first is read and dropped)."""
    sock.settimeout(seconds)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    return True


def test_a_head_not_in_within_the_deadline_closes_its_connection(app):
    with serve(app, http=head_timed_protocol(HEAD_TIMEOUT_S)) as (base, _):
        host, port = base.removeprefix("http://").split(":")
        silent = socket.create_connection((host, int(port)))
        trickling = socket.create_connection((host, int(port)))
        kept_alive = socket.create_connection((host, int(port)))
        with silent, trickling, kept_alive:
            trickling.sendall(b"GET /healthz HTTP/1.1\r\nHo")
            kept_alive.sendall(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
            assert kept_alive.recv(65536).startswith(b"HTTP/1.1 200")
            kept_alive.sendall(b"GET /healthz HTTP/1.1\r\n")  # the next request's head, never finished
            started = time.monotonic()
            assert httpx.get(f"{base}/healthz").status_code == 200  # others are served meanwhile
            for sock in (silent, trickling, kept_alive):
                assert closed_within(sock, HEAD_TIMEOUT_S + 3)
            assert time.monotonic() - started < HEAD_TIMEOUT_S + 2


def test_a_prompt_request_on_a_kept_alive_connection_is_served_after_the_deadline(app):
    """The deadline is per head: a connection idle in between is uvicorn's keep-alive's to close, not ours."""
    with serve(app, http=head_timed_protocol(HEAD_TIMEOUT_S)) as (base, _), httpx.Client(base_url=base) as http:
        assert http.get("/healthz").status_code == 200
        time.sleep(2 * HEAD_TIMEOUT_S)
        assert http.get("/healthz").status_code == 200
