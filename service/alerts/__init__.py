"""Alerts: rules over a job's recorded series, stored once each, and posted to an optional webhook."""

from service.alerts.record import check_alerts
from service.alerts.webhook import WebhookNotifier

__all__ = ["WebhookNotifier", "check_alerts"]
