"""The listener thread of the wake-ups: one connection kept open, reconnected with back-off.

:class:`ListenerThread` is the shared part of
:class:`~django_debounce.worker.wakeup.PostgresListener` (LISTEN/NOTIFY) and
:class:`~django_debounce.worker.wakeup_redis.RedisListener` (pub/sub): it runs the
subclass's ``listen()``, and when the connection is lost logs it once, waits
(0.5 s, doubling to 30 s) and connects again, while the worker goes on
polling (decision 84).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

logger = logging.getLogger("django_debounce.wakeup")

#: Seconds a listener waits before reconnecting, doubled after each failure up to the cap.
RECONNECT_FIRST, RECONNECT_CAP = 0.5, 30.0


def _serves(queues: frozenset[str], payload: str) -> bool:
    return not queues or payload in queues


class ListenerThread(threading.Thread):
    """A daemon thread that keeps one listening connection and reconnects with back-off.

    Subclasses implement :meth:`listen` (connect, subscribe, wait for
    messages until :attr:`stopping` is set; raise on a lost connection) and
    :meth:`close`. Losing the connection is logged once (WARNING) until it
    is back (INFO); on every (re)connect the event is set, since wake-ups
    may have been missed meanwhile.
    """

    kind = "listener"
    listens = True

    def __init__(self, event: threading.Event, *, queues: Sequence[str]) -> None:
        super().__init__(name=f"debounce-wakeup-{self.kind}", daemon=True)
        self.event = event
        self.queues = frozenset(queues)
        self.stopping = threading.Event()
        self.connected = threading.Event()
        self.failures = 0  # connection attempts failed in a row
        self.start()

    def stop(self) -> None:
        """Stop listening and close the connection; wait briefly for the thread."""
        self.stopping.set()
        self.join(timeout=2.0)

    def wake(self, payload: str) -> None:
        if _serves(self.queues, payload):
            self.event.set()

    def on_connected(self) -> None:
        """Call once subscribed: wake the worker (messages may have been missed), log, reset."""
        self.connected.set()
        self.event.set()
        if self.failures:
            logger.info("%s wake-up is back", self.kind, extra={"action": "wakeup_recovered"})
        else:
            logger.info("%s wake-up listening", self.kind, extra={"action": "wakeup_listening"})
        self.failures = 0

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                self.listen()
            except Exception as exc:  # a lost connection, or anything else: polling covers it
                self.connected.clear()
                if not self.failures:
                    logger.warning(
                        "%s wake-up lost (%s); polling until it is back",
                        self.kind,
                        exc,
                        extra={"action": "wakeup_lost"},
                    )
                self.failures += 1
                delay = RECONNECT_FIRST * 2 ** min(self.failures - 1, 6)
                self.stopping.wait(min(RECONNECT_CAP, delay))
            finally:
                self.close()

    def listen(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def close(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError


__all__ = ["RECONNECT_CAP", "RECONNECT_FIRST", "ListenerThread"]
