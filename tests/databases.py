"""Which databases a test runs on. Fixtures built on ``database_url`` (``engine``, the API's ``client``) run each
test on SQLite and then on PostgreSQL; that is kept for what the database decides: queries, ordering and keyset
pages, locking and concurrent claims, idempotency races, migrations, values PostgreSQL refuses (NUL bytes, integer
ranges), leases. Checks of plain HTTP behaviour (validation errors, auth, body limits, headers) and of the command
line's side of things learn nothing more from a second database, and run on SQLite only, marked ``sqlite_only``."""

from __future__ import annotations

import pytest

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
