"""What operators do to jobs: windows, dead letters, sweeps, retention, status.

:mod:`.windows` (run a waiting window now, cancel it), :mod:`.dead_letters` and
:mod:`.sweep` (retry dead letters), :mod:`.retention` (prune finished jobs),
:mod:`.status` (``manage.py debounce_status``).

Nothing is imported here: importing this package imports no models.
"""
