"""Loading libtensorcast and declaring its C interface to ctypes.

The library is looked for, in order:

1. ``$TENSORCAST_LIB`` when set (and only there: a path that was asked for
   and does not load is an error, not a reason to take another library);
2. beside this package (an installed copy) and in the source tree's
   ``c/build`` (after ``make build``);
3. the system's library path (``libtensorcast.so``).

Every function is called through :class:`ctypes.CDLL`, which releases the
GIL for the duration of each foreign call: a call waiting in the daemon
never blocks the interpreter's other threads.

The structures below mirror ``c/include/tensorcast.h`` field for field.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path
from typing import Any, List, Tuple

__all__ = ["lib", "path"]

c_u8 = ctypes.c_uint8
c_u32 = ctypes.c_uint32
c_u64 = ctypes.c_uint64
c_int = ctypes.c_int
c_size = ctypes.c_size_t
c_char_p = ctypes.c_char_p
c_void_p = ctypes.c_void_p
P = ctypes.POINTER


class Options(ctypes.Structure):
    _fields_ = [
        ("socket", c_char_p),
        ("name", c_char_p),
        ("connect_timeout_ms", c_u32),
        ("call_timeout_ms", c_u32),
        ("max_frame", c_u32),
        ("lane", c_char_p),
        ("policy_version", c_u32),
        ("reconnect", ctypes.c_int),
    ]


class CallOpts(ctypes.Structure):
    _fields_ = [
        ("idempotency_key", c_char_p),
        ("lane", c_char_p),
        ("policy_version", c_u32),
        ("qos", c_u8),
        ("replicas", c_u8),
        ("deadline_ms", c_u32),
    ]


class Limits(ctypes.Structure):
    _fields_ = [
        ("max_frame", c_u32),
        ("max_buffers", c_u32),
        ("max_blocks", c_u32),
        ("max_batches", c_u32),
        ("max_batch_capacity", c_u32),
        ("max_requests", c_u32),
        ("max_idempotency_keys", c_u32),
    ]


class Hello(ctypes.Structure):
    _fields_ = [
        ("protocol_version", c_u32),
        ("daemon_id", c_char_p),
        ("version", c_char_p),
        ("peer_addr", c_char_p),
        ("limits", Limits),
    ]


class Pool(ctypes.Structure):
    _fields_ = [
        ("segment", c_u64),
        ("size", c_u64),
        ("base", c_void_p),
        ("fd", c_int),
        ("block_classes", P(c_u64)),
        ("n_block_classes", c_size),
    ]


class Buffer(ctypes.Structure):
    _fields_ = [("id", c_u64), ("data", c_void_p), ("size", c_u64), ("fd", c_int), ("huge", c_u64)]


class Request(ctypes.Structure):
    _fields_ = [
        ("local", c_u64),
        ("local_offset", c_u64),
        ("target", c_u64),
        ("target_offset", c_u64),
        ("length", c_u64),
        ("op", c_u32),
    ]


class Notify(ctypes.Structure):
    _fields_ = [("payload", c_void_p), ("len", c_size)]


class TaskInfo(ctypes.Structure):
    _fields_ = [("state", c_int), ("code", c_int), ("transferred", c_u64)]


class Summary(ctypes.Structure):
    _fields_ = [
        ("total", c_u32),
        ("waiting", c_u32),
        ("pending", c_u32),
        ("completed", c_u32),
        ("failed", c_u32),
        ("timeout", c_u32),
        ("canceled", c_u32),
        ("transferred", c_u64),
    ]


class Remote(ctypes.Structure):
    _fields_ = [("id", c_u64), ("size", c_u64), ("epoch", c_u64)]


class Notification(ctypes.Structure):
    _fields_ = [("segment", c_char_p), ("payload", P(c_u8)), ("len", c_size)]


class Counter(ctypes.Structure):
    _fields_ = [("name", c_char_p), ("value", c_u64)]


class Counters(ctypes.Structure):
    _fields_ = [("items", P(Counter)), ("n", c_size)]


class Stats(ctypes.Structure):
    _fields_ = [
        ("pool", Counters),
        ("engine", Counters),
        ("connection", Counters),
        ("transports", Counters),
        ("connections", c_u32),
        ("store", Counters),
    ]


class QueueOpts(ctypes.Structure):
    _fields_ = [
        ("cq_entries", c_u32),
        ("data_size", c_u32),
        ("request_timeout_us", c_u32),
        ("spin_us", c_u32),
        ("flags", c_u32),
    ]


class Cqe(ctypes.Structure):
    _fields_ = [("user_data", c_u64), ("transferred", c_u64), ("code", c_int), ("state", c_int)]


class QueueInfo(ctypes.Structure):
    _fields_ = [
        ("id", c_u64),
        ("sq_entries", c_u32),
        ("cq_entries", c_u32),
        ("data_size", c_u32),
        ("state", c_u32),
        ("submitted", c_u64),
        ("reaped", c_u64),
        ("submit_doorbells", c_u64),
        ("reap_doorbells", c_u64),
        ("sleeps", c_u64),
        ("missed_wakeups", c_u64),
    ]


class QueueWaits(ctypes.Structure):
    _fields_ = [
        ("naps", c_u64),
        ("late_wakes", c_u64),
    ]


class Key(ctypes.Structure):
    _fields_ = [("data", c_void_p), ("len", c_size)]


class Keys(ctypes.Structure):
    # packed is a const void * in C; as c_char_p a bytes object assigned to
    # it is referenced, not copied, and kept alive with the structure.
    _fields_ = [("n", c_size), ("keys", P(Key)), ("packed", c_char_p), ("packed_len", c_size)]


class Extent(ctypes.Structure):
    _fields_ = [("segment", c_u64), ("offset", c_u64), ("length", c_u64)]


class KeyInfo(ctypes.Structure):
    _fields_ = [
        ("key", P(c_u8)),
        ("key_len", c_size),
        ("size", c_u64),
        ("pins", c_u32),
        ("in_l1", c_u8),
        ("in_l2", c_u8),
        ("dirty", c_u8),
        ("tombstone", c_u8),
    ]


class Holder(ctypes.Structure):
    _fields_ = [
        ("id", c_char_p),
        ("epoch", c_u64),
        ("tier", c_u8),
        ("size", c_u64),
        ("crc32c", c_u32),
    ]


class KeyLocation(ctypes.Structure):
    _fields_ = [
        ("shard", c_u32),
        ("home", c_char_p),
        ("generation", c_u64),
        ("n_holders", c_size),
        ("holders", P(Holder)),
    ]


MAX_HANDLE_TOKEN = 256
MAX_OP_ID = 128


class Handle(ctypes.Structure):
    _fields_ = [
        ("token", c_u8 * MAX_HANDLE_TOKEN),
        ("token_len", c_size),
        ("id", c_u64),
        ("expiry_unix_ms", c_u64),
    ]


class KvOpts(ctypes.Structure):
    _fields_ = [("max_keys", c_u32), ("timeout_ms", c_u32), ("spin_us", c_u32), ("flags", c_u32)]


CO = P(CallOpts)
KS = P(Keys)
PI = P(c_int)
PU = P(c_u64)

# name: (argument types, result type); every call returns an int code
# unless it says otherwise.
_PROTOTYPES: dict[str, Tuple[List[Any], Any]] = {
    "tc_strerror": ([c_int], c_char_p),
    "tc_connect": ([P(Options), P(c_void_p)], c_int),
    "tc_close": ([c_void_p], None),
    "tc_shutdown": ([c_void_p], None),
    "tc_hello_info": ([c_void_p], P(Hello)),
    "tc_reconnects": ([c_void_p], c_u32),
    "tc_ping": ([c_void_p, c_void_p, c_size, CO], c_int),
    "tc_stats_get": ([c_void_p, P(P(Stats)), CO], c_int),
    "tc_free": ([c_void_p], None),
    "tc_pool_info": ([c_void_p], P(Pool)),
    "tc_blocks_alloc": ([c_void_p, c_u32, c_u64, P(c_u64), CO], c_int),
    "tc_blocks_free": ([c_void_p, P(c_u64), c_size, P(c_int), CO], c_int),
    "tc_buffer_create": ([c_void_p, c_u64, P(P(Buffer)), CO], c_int),
    "tc_buffer_destroy": ([c_void_p, P(Buffer), CO], c_int),
    "tc_buffer_register_fd": ([c_void_p, c_int, c_u64, P(c_u64), CO], c_int),
    "tc_file_register": ([c_void_p, c_char_p, c_int, c_u64, P(c_u64), P(c_u64), CO], c_int),
    "tc_segment_unregister": ([c_void_p, c_u64, CO], c_int),
    "tc_locate": ([c_void_p, c_void_p, c_u64, P(c_u64), P(c_u64)], c_int),
    "tc_batch_alloc": ([c_void_p, c_u32, P(c_u64), CO], c_int),
    "tc_batch_submit": ([c_void_p, c_u64, P(Request), c_size, P(Notify), P(c_int), CO], c_int),
    "tc_task_status": ([c_void_p, c_u64, c_u32, P(TaskInfo), CO], c_int),
    "tc_batch_status": ([c_void_p, c_u64, P(Summary), CO], c_int),
    "tc_batch_wait": ([c_void_p, c_u64, c_u32, P(Summary), CO], c_int),
    "tc_batch_free": ([c_void_p, c_u64, CO], c_int),
    "tc_transfer": ([c_void_p, P(Request), c_size, P(Notify), c_u32, P(c_int), P(c_int), P(Summary), CO], c_int),
    "tc_segment_export": ([c_void_p, c_char_p, c_u64, c_u64, c_u64, ctypes.c_uint, P(c_u64), CO], c_int),
    "tc_segment_export_to": ([c_void_p, c_char_p, P(c_char_p), c_size, c_u64, c_u64, c_u64, ctypes.c_uint, P(c_u64),
                              CO], c_int),
    "tc_segment_unexport": ([c_void_p, c_char_p, CO], c_int),
    "tc_remote_open": ([c_void_p, c_char_p, ctypes.c_uint, c_int, P(Remote), CO], c_int),
    "tc_remote_close": ([c_void_p, c_u64, CO], c_int),
    "tc_notify_subscribe": ([c_void_p, c_char_p, CO], c_int),
    "tc_notify_poll": ([c_void_p, c_u32, c_u32, P(P(Notification)), P(c_size), CO], c_int),
    "tc_queue_open": ([c_void_p, c_u32, P(QueueOpts), P(c_void_p)], c_int),
    "tc_queue_submit": ([c_void_p, P(Request), P(c_u64), c_size, P(c_size)], c_int),
    "tc_queue_submit_notify": ([c_void_p, P(Request), P(Notify), P(c_u64), c_size, P(c_size)], c_int),
    "tc_queue_nop": ([c_void_p, c_u64, P(c_size)], c_int),
    "tc_queue_reap": ([c_void_p, P(Cqe), c_size, c_size, ctypes.c_int64, P(c_size)], c_int),
    "tc_queue_wait": ([c_void_p, c_size, ctypes.c_int64], c_int),
    "tc_queue_get_info": ([c_void_p, P(QueueInfo)], None),
    "tc_queue_get_waits": ([c_void_p, P(QueueWaits)], None),
    "tc_queue_shutdown": ([c_void_p], None),
    "tc_queue_close": ([c_void_p], c_int),
    "tc_keys_packed_len": ([KS], c_size),
    "tc_keys_pack": ([KS, c_void_p, c_size], c_size),
    "tc_store_put": ([c_void_p, KS, P(Extent), c_int, PI, CO], c_int),
    "tc_store_read": ([c_void_p, KS, P(Extent), PU, PI, CO], c_int),
    "tc_store_remove": ([c_void_p, KS, PI, CO], c_int),
    "tc_store_pin": ([c_void_p, KS, c_u32, PI, CO], c_int),
    "tc_store_unpin": ([c_void_p, KS, PI, CO], c_int),
    "tc_store_reserve": ([c_void_p, KS, PU, PU, PI, CO], c_int),
    "tc_store_commit": ([c_void_p, KS, c_int, PI, CO], c_int),
    "tc_store_abort": ([c_void_p, KS, PI, CO], c_int),
    "tc_store_stat": ([c_void_p, c_char_p, c_size, P(KeyInfo), CO], c_int),
    "tc_store_list": ([c_void_p, c_char_p, c_size, c_char_p, c_size, c_u32, P(P(KeyInfo)), P(c_size), PI, CO],
                      c_int),
    "tc_store_flush": ([c_void_p, c_u32, CO], c_int),
    "tc_handle_issue": ([c_void_p, KS, c_u32, P(Handle), CO], c_int),
    "tc_handle_renew": ([c_void_p, c_char_p, c_size, c_u32, P(Handle), CO], c_int),
    "tc_handle_release": ([c_void_p, c_char_p, c_size, CO], c_int),
    "tc_lease_create": ([c_void_p, c_char_p, c_size, KS, c_u32, PU, PI, CO], c_int),
    "tc_lease_release": ([c_void_p, c_char_p, c_size, CO], c_int),
    "tc_cluster_locate": ([c_void_p, c_char_p, c_size, P(P(KeyLocation)), CO], c_int),
    "tc_results_create": ([c_void_p, c_u32, P(c_void_p)], c_int),
    "tc_results_in": ([c_void_p, P(Buffer), c_u64, c_u32, P(c_void_p)], c_int),
    "tc_results_destroy": ([c_void_p], None),
    "tc_queue_store_get": ([c_void_p, KS, c_void_p, c_u64, P(c_size)], c_int),
    "tc_queue_store_reserve": ([c_void_p, KS, c_u64, c_void_p, c_u64, P(c_size)], c_int),
    "tc_queue_store_commit": ([c_void_p, KS, c_int, c_void_p, c_u64, P(c_size)], c_int),
    "tc_queue_store_exists": ([c_void_p, KS, c_void_p, c_u64, P(c_size)], c_int),
    "tc_queue_store_unpin": ([c_void_p, KS, c_void_p, c_u64, P(c_size)], c_int),
    "tc_queue_store_lookup_prefix": ([c_void_p, KS, c_int, c_u64, P(c_size)], c_int),
    "tc_results_check": ([c_void_p, P(Cqe), PI, PU, PU], c_int),
    "tc_prefix_check": ([c_void_p, P(Cqe), c_size, P(c_size)], c_int),
    "tc_kv_open": ([c_void_p, P(KvOpts), P(c_void_p)], c_int),
    "tc_kv_close": ([c_void_p], None),
    "tc_kv_get": ([c_void_p, KS, PU, PU, PI], c_int),
    "tc_kv_reserve": ([c_void_p, KS, c_u64, PU, PI], c_int),
    "tc_kv_commit": ([c_void_p, KS, c_int, PI], c_int),
    "tc_kv_exists": ([c_void_p, KS, PI], c_int),
    "tc_kv_lookup_prefix": ([c_void_p, KS, c_int, P(c_size)], c_int),
    "tc_kv_unpin": ([c_void_p, KS, PI], c_int),
    "tc_kv_put": ([c_void_p, KS, P(c_void_p), PU, c_int, PI], c_int),
    "tc_kv_read": ([c_void_p, KS, P(c_void_p), PU, PU, PI], c_int),
}


def _candidates() -> List[Tuple[str, str]]:
    env = os.environ.get("TENSORCAST_LIB")
    if env:
        return [("$TENSORCAST_LIB", env)]
    here = Path(__file__).resolve().parent
    found = ctypes.util.find_library("tensorcast")
    return [
        ("beside the package", str(here / "libtensorcast.so")),
        ("the source tree (make build)", str(here.parent.parent / "c" / "build" / "libtensorcast.so")),
        ("the system's library path", found or "libtensorcast.so"),
    ]


def _load() -> Tuple[ctypes.CDLL, str]:
    tried = []
    for where, p in _candidates():
        if os.sep in p and not os.path.exists(p):
            tried.append(f"{where}: {p}: no such file")
            continue
        try:
            dll = ctypes.CDLL(p, use_errno=True)
        except OSError as e:
            tried.append(f"{where}: {p}: {e}")
            continue
        missing = [n for n in _PROTOTYPES if not hasattr(dll, n)]
        if missing:
            tried.append(f"{where}: {p}: lacks {', '.join(missing)} (another version of libtensorcast)")
            continue
        for name, (argtypes, restype) in _PROTOTYPES.items():
            fn = getattr(dll, name)
            fn.argtypes = argtypes
            fn.restype = restype
        return dll, p
    raise ImportError("tensorcast: cannot load libtensorcast (run `make build`, or set TENSORCAST_LIB):\n  "
                      + "\n  ".join(tried))


lib, path = _load()
