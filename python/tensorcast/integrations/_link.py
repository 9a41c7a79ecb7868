"""The integrations' connection to the daemon, dropped on a daemon error and
dialed again on demand (see the package's doc)."""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any, Callable, Dict, Optional, Set, Tuple

from ..client import Client, connect
from ..errors import Error

__all__ = ["Link", "CALL_TIMEOUT", "call_timeout_option"]

# CALL_TIMEOUT (seconds) bounds each call of an integration's client unless
# its config says otherwise: the daemon answers every call by its own
# deadlines (30 s by default), so only a daemon that answers nothing (stopped,
# wedged) runs into it, and the engine then sees a miss instead of waiting
# for good.
CALL_TIMEOUT = 60.0


def call_timeout_option(v: Any) -> float:
    """An integration's ``call_timeout`` option: seconds (a number, or text
    that reads as one), 0 for no bound; anything else (negative, not
    finite, null, a flag) is refused by name."""
    try:
        f = float(v) if not isinstance(v, bool) and isinstance(v, (int, float, str)) else math.nan
    except ValueError:
        f = math.nan
    if not 0 <= f < math.inf:
        raise ValueError(f"tensorcast: call_timeout {v!r}: want seconds >= 0 (0: no bound)")
    return f


class Link:
    """One :class:`tensorcast.Client` shared by an integration's calls.

    ``client()`` returns the live client, or dials the daemon when there is
    none and the last attempt is at least ``retry_interval`` seconds old;
    None while the daemon is away (the caller answers a miss). ``failed()``
    takes the exception a call raised: an error that leaves the connection's
    state unknown (a library code: closed, timed out, an answer that did not
    verify, a failed system call) drops the client, and the outage is logged
    once, with the reconnection when it comes; any other error (a protocol
    code, an exception of another kind) is logged once per kind of call and
    error, and the client stays. ``on_connect(client)`` runs after each dial
    (registering memory again, say); if it raises, the dial failed.
    ``call_timeout`` bounds each call (None or 0: no bound; see
    CALL_TIMEOUT).
    """

    def __init__(self, socket: Optional[str], name: str, logger: logging.Logger,
                 on_connect: Optional[Callable[[Client], None]] = None, retry_interval: float = 1.0,
                 connect_timeout: float = 1.0, call_timeout: Optional[float] = CALL_TIMEOUT,
                 **connect_kwargs: Any) -> None:
        self.socket = socket
        self.name = name
        self.log = logger
        self.on_connect = on_connect
        self.retry_interval = retry_interval
        self._kw = dict(connect_kwargs, connect_timeout=connect_timeout, call_timeout=call_timeout or None)
        # mu guards the fields below; a dial runs outside it (_dialing says
        # one is under way: the calls meanwhile answer misses).
        self._mu = threading.Lock()
        self._client: Optional[Client] = None
        self._dialing = False
        self._last_dial = float("-inf")
        self._down = False  # an outage was logged and has not ended
        self._closed = False  # close() was called: no client is kept after
        self._seen: Set[Tuple[str, object]] = set()
        self.counts: Dict[str, int] = {"dials": 0, "dial_failures": 0, "outages": 0, "errors": 0}

    def client(self) -> Optional[Client]:
        with self._mu:
            c = self._client
            if c is not None:
                return c
            now = time.monotonic()
            if self._dialing or now - self._last_dial < self.retry_interval:
                return None
            self._dialing = True
            self._last_dial = now
        c = None
        err: Optional[BaseException] = None
        try:
            c = connect(self.socket, self.name, **self._kw)
            if self.on_connect is not None:
                self.on_connect(c)
        except Exception as e:  # noqa: BLE001 - any failure to dial is an outage
            err = e
            if c is not None:
                c.close()
                c = None
        except BaseException:
            # A KeyboardInterrupt, say: it goes on, but _dialing left set
            # would answer every later call with a miss, for good.
            if c is not None:
                c.close()
            with self._mu:
                self._dialing = False
            raise
        with self._mu:
            self._dialing = False
            self.counts["dials"] += 1
            closed = self._closed
            if c is not None and closed:
                # close() came while this dial ran: the connection would be
                # kept by nobody, and never closed.
                self._client = None
            elif c is not None:
                self._client = c
        if c is not None and closed:
            c.close()
            return None
        with self._mu:
            if c is None:
                self.counts["dial_failures"] += 1
                if not self._down:
                    self._down = True
                    self.counts["outages"] += 1
                    self.log.warning("tensorcast: cannot reach the daemon at %s (%s); answering misses, retrying "
                                     "every %.1f s", self.socket or "the default socket", err, self.retry_interval)
                return None
            if self._down:
                self._down = False
                self.log.info("tensorcast: reconnected to the daemon at %s", c.socket)
            return c

    def failed(self, what: str, err: BaseException, client: Optional[Client] = None) -> None:
        """err ended a call made on client (None: the current one)."""
        # Only the library's own codes leave the connection's state unknown;
        # a protocol code or an exception of another kind (a host pool
        # whose layout does not fit, say) is about the call alone.
        code = int(err.code) if isinstance(err, Error) else None
        broken = code is not None and code < 0
        drop: Optional[Client] = None
        outage = first = False
        with self._mu:
            self.counts["errors"] += 1
            if broken:
                if client is None or client is self._client:
                    drop, self._client = self._client, None
                if not self._down:
                    self._down = outage = True
                    self.counts["outages"] += 1
            else:
                key = (what, code if code is not None else type(err).__name__)
                first = key not in self._seen
                self._seen.add(key)
        if drop is not None:
            drop.close()
        if outage:
            self.log.warning("tensorcast: %s failed (%s); the connection is dropped, answering misses until the "
                             "daemon is back", what, err)
        if first:
            self.log.warning("tensorcast: %s failed (%s); answering a miss (logged once for this call and kind of "
                             "error)", what, err, exc_info=code is None)

    def reset(self) -> None:
        """Drops the client (closing the connection releases what it held)
        so that the next call dials again at once."""
        with self._mu:
            c, self._client = self._client, None
            self._last_dial = float("-inf")
        if c is not None:
            c.close()

    def close(self) -> None:
        with self._mu:
            self._closed = True
            c, self._client = self._client, None
            self._last_dial = float("inf")  # no more dials
        if c is not None:
            c.close()
