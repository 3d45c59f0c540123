"""The Live monitor: what every viewer's refresh shows, built once and shared, and the pace of refreshes.

One sampler thread per process records the readings (core/telemetry/sampler.py); this package turns its buffer into
what the page draws. A refresh costs every viewer the same work, so the work is done once per moment and shared
(frames.py), drawn in forms the browser updates in place (charts.py), and the refresh slows down, visibly, when the
viewers together would cost the server more than its budget (pacing.py).
"""
