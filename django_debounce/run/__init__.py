"""Running a claimed job, the calls any executor makes (the built-in worker, Celery).

:func:`django_debounce.run.execution.run_job` runs one job and records its
outcome (:mod:`.outcomes`, :mod:`.final_failures`; successes in batches,
:mod:`.success_batches`); :mod:`.leases` renews and reclaims leases, from one
thread (:mod:`.lease_keeper`); :mod:`.backoff` spaces retries; :mod:`.storable`
keeps results and errors storable.

Nothing is imported here: importing this package imports no models.
"""
