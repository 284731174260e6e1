"""A JSON-over-HTTP server on loopback for tests' stand-ins of real services (a judge, a baseline model): each
POST body is parsed and handed to ``answer``, whose (status, body, headers) go back as JSON."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[dict[str, Any]], tuple[int, dict[str, Any] | str, dict[str, str]]]


@contextmanager
def json_server(answer: Answer) -> Iterator[str]:
    """Serve ``answer`` in a thread (one thread per request); yields ``http://127.0.0.1:PORT``."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: Any) -> None:
            pass

        def do_POST(self) -> None:  # noqa: N802 -- http.server's name
            status, body, headers = answer(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            data = (body if isinstance(body, str) else json.dumps(body)).encode()
            try:
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **headers}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up waiting (a timeout test's point)
                pass

    with http_server(Handler) as url:
        yield url


@contextmanager
def http_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served on a free loopback port, a thread per request; yields ``http://127.0.0.1:PORT``."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
