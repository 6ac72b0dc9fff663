"""The NOTIFY channel and the names on it: the SQL that sends (app/db/keys.py, app/db/flow.py) and the
processes that send wake-ups and listen (app/core/wakeups.py, app/maintenance/listener.py) must spell them
alike. The grammar of the messages is in app/core/wakeups.py."""

from __future__ import annotations

CHANNEL = "jobq_wakeup"
KEYS_CHANGED = "keys k"
CONFIG_CHANGED = "config"  # + " <queue>"
JOB = "#"  # the name of a job in presence and wake-up messages is "#<id>"
