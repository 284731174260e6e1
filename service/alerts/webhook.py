"""Post new alerts to an operator's webhook in the background, with retries.

Delivery never holds up training: ``notify`` schedules a task per alert and returns. Connection
errors, timeouts, 429 and 5xx are retried with exponential backoff (a 429's ``Retry-After`` is
honoured up to a cap); any other answer is final. The outcome is written on the alert row
(``webhook_status`` pending -> delivered | failed, ``webhook_attempts``) in its own transaction.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import httpx
from sqlalchemy.engine import Engine
from sqlmodel import Session

from service.alerts.record import alert_data
from service.store.tables import Alert

log = logging.getLogger(__name__)


class WebhookNotifier:
    """Delivers alerts to ``url`` as JSON (with ``url`` None it does nothing); never raises into its caller."""

    def __init__(
        self,
        url: str | None,
        engine: Engine,
        *,
        timeout_s: float = 5.0,
        max_attempts: int = 5,
        backoff_s: float = 0.5,
        max_retry_after_s: float = 30.0,
        close_timeout_s: float = 30.0,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, not {max_attempts}")
        self.url = url
        self.engine = engine
        self.timeout_s = timeout_s
        self.max_attempts = max_attempts
        self.backoff_s = backoff_s  # waits backoff_s, 2 * backoff_s, 4 * backoff_s, ... between attempts
        self.max_retry_after_s = max_retry_after_s
        self.close_timeout_s = close_timeout_s
        self._client: httpx.AsyncClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    def notify(self, alerts: Sequence[Alert]) -> None:
        """Schedule the delivery of each (committed) alert on the running loop and return at once."""
        if self.url is None or not alerts:
            return
        try:
            if self._closed:
                raise RuntimeError("the notifier is closed")
            loop = asyncio.get_running_loop()
            for alert in alerts:
                task = loop.create_task(self._deliver(alert_data(alert)))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except Exception as exc:  # the alerts are stored either way; only their delivery is lost
            log.warning("%d alert(s) not posted to the webhook: %s", len(alerts), exc)

    async def aclose(self) -> None:
        """Wait up to ``close_timeout_s`` for deliveries in flight, cancel the rest (their alerts stay
        ``pending``), and close the HTTP client."""
        self._closed = True
        if self._tasks:
            _, unfinished = await asyncio.wait(set(self._tasks), timeout=self.close_timeout_s)
            if unfinished:
                log.warning("gave up on %d webhook deliveries at shutdown: their alerts stay pending", len(unfinished))
                for task in unfinished:
                    task.cancel()
                await asyncio.gather(*unfinished, return_exceptions=True)
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _deliver(self, payload: dict[str, Any]) -> None:
        alert_id = payload["id"]
        try:
            await asyncio.to_thread(self._record, alert_id, status="pending", attempts=0)
            attempts, delivered = await self._post(payload)
            status = "delivered" if delivered else "failed"
            await asyncio.to_thread(self._record, alert_id, status=status, attempts=attempts)
        except Exception as exc:  # a store error here must not reach the training loop
            log.warning("could not record the webhook delivery of alert %s: %s: %s", alert_id, type(exc).__name__, exc)

    async def _post(self, payload: dict[str, Any]) -> tuple[int, bool]:
        """POST until delivered or out of attempts: (attempts made, delivered)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=self.timeout_s)
        for attempt in range(1, self.max_attempts + 1):
            delay = self.backoff_s * 2 ** (attempt - 1)
            try:
                response = await self._client.post(self.url, json=payload)
            except httpx.TransportError as exc:  # refused, reset, timed out
                outcome = type(exc).__name__
            else:
                if response.is_success:
                    return attempt, True
                if response.status_code != 429 and response.status_code < 500:
                    log.warning("webhook refused alert %s: HTTP %d", payload["id"], response.status_code)
                    return attempt, False
                outcome = f"HTTP {response.status_code}"
                if response.status_code == 429:
                    delay = _retry_after(response, default=delay, cap=self.max_retry_after_s)
            if attempt < self.max_attempts:
                log.info("webhook delivery of alert %s: %s; retrying in %.2fs", payload["id"], outcome, delay)
                await asyncio.sleep(delay)
        log.warning("webhook delivery of alert %s failed after %d attempts: %s", payload["id"], attempt, outcome)
        return self.max_attempts, False

    def _record(self, alert_id: int, *, status: str, attempts: int) -> None:
        with Session(self.engine) as session:
            alert = session.get(Alert, alert_id)
            if alert is None:  # rolled back with its step when the job resumed from an earlier checkpoint
                return
            alert.webhook_status = status
            alert.webhook_attempts = attempts
            session.add(alert)
            session.commit()


def _retry_after(response: httpx.Response, *, default: float, cap: float) -> float:
    """The seconds a 429 asks us to wait (capped), or ``default`` when it names none or a date."""
    try:
        seconds = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return default
    return min(seconds, cap) if seconds >= 0 else default
