"""Durable workers: claim jobs under leases, train them, hand them back on shutdown."""

from service.worker.runner import Worker

__all__ = ["Worker"]
