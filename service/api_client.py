"""A small synchronous client of the artsvc HTTP API, for the command line's client verbs.

Every failure is an ``ApiError`` whose message a user can act on: the API's own ``detail`` for a
refused request, or where the client tried to connect when the API cannot be reached. The event
stream reconnects after a dropped connection from the last event it delivered (``Last-Event-ID``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO
from urllib.parse import quote

import httpx

from service.sse import EventStreamParser, ServerSentEvent

STREAM_READ_TIMEOUT_S = 60.0  # the server pings an idle stream far more often than this
RECONNECT_DELAYS_S = (0.5, 1, 2, 4, 8, 15, 15, 15)  # a try after each (a minute in all: a server restart), then give up


class ApiError(Exception):
    """A request the API refused (``status`` set) or could not be made (``status`` None)."""

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ApiClient:
    """The API at ``base_url``, called with bearer ``token`` (None for a server in local mode)."""

    def __init__(self, *, base_url: str, token: str | None, timeout_s: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        if not self.base_url.startswith(("http://", "https://")):
            raise ApiError(f"the API URL must start with http:// or https://, not {base_url!r}")
        headers = {}
        if token:
            headers["Authorization"] = "Bearer " + _header_value(token, "the token (--token or ARTSVC_TOKEN)")
        self._token_given = bool(token)
        try:
            self._http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s)
        except httpx.InvalidURL as exc:
            raise ApiError(f"invalid API URL {base_url!r}: {exc}") from None

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._http.close()

    def wait_until_healthy(self, timeout_s: float = 120.0) -> None:
        """Return once ``/healthz`` says ok (a server just started: its store and workers up); ApiError after
        ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if self._http.get("/healthz").json().get("status") == "ok":
                    return
            except (httpx.TransportError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise ApiError(f"the API at {self.base_url} was not healthy within {timeout_s:.0f} s")
            time.sleep(0.2)

    def submit(self, spec: Any, *, idempotency_key: str | None = None) -> tuple[dict[str, Any], bool]:
        """Queue a job; returns it and whether an earlier submission with the same key made it."""
        headers = {"Idempotency-Key": _header_value(idempotency_key, "the idempotency key")} if idempotency_key else {}
        response = self._request("POST", "/v1/jobs", json=spec, headers=headers)
        return response.json(), response.headers.get("Idempotent-Replayed") == "true"

    def get_job(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{_quote(job_id)}").json()

    def curves_png(self, job_id: str) -> bytes:
        return self._request("GET", f"/v1/jobs/{_quote(job_id)}/curves.png").content

    def checkpoints(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{_quote(job_id)}/checkpoints").json()

    def download_adapter(
        self, job_id: str, step: str, sink: BinaryIO, *, on_bytes: Callable[[int], None] | None = None
    ) -> int | None:
        """Stream one checkpoint's adapter archive (.tar.gz) into ``sink``, calling ``on_bytes`` with each chunk's
        size; returns the step the API served (``step`` may say ``best`` or ``latest``; None if it did not say)."""
        path = f"/v1/jobs/{_quote(job_id)}/checkpoints/{_quote(step)}/adapter"
        response = self._send(self._http.build_request("GET", path), stream=True)
        try:
            if response.is_error:
                response.read()
                raise self._refusal(response)
            for chunk in response.iter_bytes():
                sink.write(chunk)
                if on_bytes is not None:
                    on_bytes(len(chunk))
            served = response.headers.get("Checkpoint-Step", "")
            return int(served) if served.isdigit() else None
        except httpx.TransportError as exc:
            raise ApiError(f"the download from {self.base_url} broke off: {_reason(exc)}") from None
        finally:
            response.close()

    def chat(self, model: str, messages: list[dict[str, Any]], **sampling: Any) -> dict[str, Any]:
        """One OpenAI chat completion of ``model`` (``JOB_ID`` or ``JOB_ID@STEP``); sampling parameters left None are
        the server's defaults."""
        body = {"model": model, "messages": messages} | {k: v for k, v in sampling.items() if v is not None}
        return self._request("POST", "/v1/chat/completions", json=body).json()

    def submit_evaluation(self, spec: Any) -> dict[str, Any]:
        return self._request("POST", "/v1/evaluations", json=spec).json()

    def get_evaluation(self, evaluation_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/evaluations/{_quote(evaluation_id)}").json()

    def compare(self, baseline: str, candidate: str, **params: Any) -> dict[str, Any]:
        query = {"baseline": baseline, "candidate": candidate} | {k: v for k, v in params.items() if v is not None}
        return self._request("GET", "/v1/compare", params=query).json()

    def events(self, job_id: str, *, after_id: str | None = None) -> Iterator[ServerSentEvent]:
        """The job's events as a live stream, from the first (or the one after ``after_id``) to ``end``.

        A dropped or refused connection or a 5xx is retried with growing delays from the last event
        delivered, so none is repeated or lost; past the retries, or on a 4xx, it raises ApiError.
        """
        last_id, failures = after_id, 0
        while True:
            parser = EventStreamParser(last_event_id=last_id)
            try:
                for event in self._stream(job_id, last_id, parser):
                    failures, last_id = 0, event.id
                    yield event
                    if event.event == "end":
                        return
                problem = "the event stream closed before the job ended"
            except httpx.TransportError as exc:
                problem = f"lost the event stream from {self.base_url}: {_reason(exc)}"
            except ApiError as exc:
                if exc.status is not None and exc.status < 500:
                    raise
                problem = str(exc)
            if failures == len(RECONNECT_DELAYS_S):
                raise ApiError(f"{problem}; gave up after {failures} reconnection attempts")
            delay = max(RECONNECT_DELAYS_S[failures], (parser.retry_ms or 0) / 1000)
            failures += 1
            time.sleep(delay)

    def _stream(self, job_id: str, last_id: str | None, parser: EventStreamParser) -> Iterator[ServerSentEvent]:
        headers = {"Accept": "text/event-stream"} | ({"Last-Event-ID": last_id} if last_id else {})
        timeout = httpx.Timeout(self._http.timeout.connect, read=STREAM_READ_TIMEOUT_S)
        request = self._http.build_request("GET", f"/v1/jobs/{_quote(job_id)}/events", headers=headers, timeout=timeout)
        response = self._send(request, stream=True)
        try:
            if response.is_error:
                response.read()
                raise self._refusal(response)
            for text in response.iter_text():
                yield from parser.feed(text)
        finally:
            response.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._send(self._http.build_request(method, path, **kwargs))
        if response.is_error:
            raise self._refusal(response)
        return response

    def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        try:
            return self._http.send(request, stream=stream)
        except httpx.TransportError as exc:
            hint = "set --api-url or ARTSVC_API_URL"
            raise ApiError(f"cannot reach the API at {self.base_url}: {_reason(exc)} ({hint})") from None

    def _refusal(self, response: httpx.Response) -> ApiError:
        """The API's ``detail`` (or the message of OpenAI's error envelope, which the chat routes answer in; or the
        bare status when the body has neither), with a hint for a missing token."""
        try:
            body = response.json()
            detail = body.get("detail") or (body.get("error") or {}).get("message")
        except (ValueError, AttributeError):
            detail = None
        message = f"{detail or response.reason_phrase} (HTTP {response.status_code})"
        if response.status_code == 401 and not self._token_given:
            message += "; pass --token or set ARTSVC_TOKEN"
        return ApiError(message, status=response.status_code)


def _header_value(value: str, what: str) -> str:
    if not (value.isascii() and value.isprintable()):
        raise ApiError(f"{what} has characters no HTTP header can carry")
    return value


def _quote(job_id: str) -> str:
    """A job id as one path segment, whatever the user typed."""
    return quote(job_id, safe="")


def _reason(exc: httpx.TransportError) -> str:
    return str(exc) or type(exc).__name__
