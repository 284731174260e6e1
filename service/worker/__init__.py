"""Durable workers: claim jobs under leases (leases.py), train them (runner.py: imports torch and ART), hand them back
on shutdown; and the supervisor that keeps worker processes running under ``artsvc serve`` (supervisor.py)."""
