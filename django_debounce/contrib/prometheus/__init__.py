"""Prometheus metrics: counters fed by the package's signals, a collector read at scrape, the view.

Needs ``prometheus_client`` (the ``metrics`` extra).
"""
