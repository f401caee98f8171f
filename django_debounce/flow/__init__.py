"""Flow control: the rules a claim admits a job by (§6).

:mod:`.rules` holds the verdict (rate, cap, breaker, dependencies) written once;
:mod:`.admission` applies it over a claim's candidates; :mod:`.codel` sheds from a
queue that stays late; :mod:`.throttle` and :mod:`.redis_buckets` /
:mod:`.redis_tokens` are the token buckets (database or Redis);
:mod:`.start_rules` says which rule is judged when a job starts;
:mod:`.breaker_runs` records a run for a circuit breaker; :mod:`.hold_reasons`
explains why a READY job waits (the admin's "held back by").

Nothing is imported here: importing this package imports no models.
"""
