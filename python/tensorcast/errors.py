"""Status codes and the exception a failed call raises."""

from __future__ import annotations

import enum
import os
from typing import Optional

from ._lib import lib

__all__ = ["Error", "Status"]


class Status(enum.IntEnum):
    """A call's or an item's code: the protocol's (``enum Code`` in
    fbs/control.fbs, 0..10) and libtensorcast's local ones (negative)."""

    OK = 0
    INVALID_ARGUMENT = 1
    NOT_FOUND = 2
    ALREADY_EXISTS = 3
    BUSY = 4
    RESOURCE_EXHAUSTED = 5
    FAILED_PRECONDITION = 6
    PERMISSION_DENIED = 7
    DEADLINE_EXCEEDED = 8
    UNAVAILABLE = 9
    INTERNAL = 10
    # Library-local: the connection broke or is closed; a connect or call
    # timeout ran out; the daemon's answer did not check; a system call
    # failed; out of memory; another protocol version; a library bug.
    CLOSED = -1
    TIMED_OUT = -2
    PROTOCOL = -3
    SYSTEM = -4
    NO_MEMORY = -5
    VERSION = -6
    LIBRARY = -7

    @classmethod
    def _missing_(cls, value: object) -> Optional["Status"]:
        # A code from a newer daemon: kept as it is, not mapped to another.
        if isinstance(value, int):
            m = int.__new__(cls, value)
            m._name_ = f"CODE_{value}"
            m._value_ = value
            return m
        return None


class Error(Exception):
    """A failed call. ``code`` is its :class:`Status`; ``errno`` is set for
    :attr:`Status.SYSTEM`."""

    def __init__(self, code: int, what: str, errno: int = 0) -> None:
        self.code = Status(code)
        self.errno = errno
        text = lib.tc_strerror(int(code)).decode()
        if self.code == Status.SYSTEM and errno:
            text = f"{os.strerror(errno)}"
        super().__init__(f"tensorcast: {what}: {text}")
