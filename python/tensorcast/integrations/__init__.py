"""KV-offload integrations of tensorcast with inference engines.

- :mod:`tensorcast.integrations.sglang`: a storage backend with the shape of
  SGLang's ``HiCacheStorage`` and a host allocator that puts SGLang's host KV
  pool in memory the daemon maps.
- :mod:`tensorcast.integrations.vllm`: an object with the shape of vLLM's
  ``OffloadingManager``.

Neither imports its engine: they are duck-typed to the engines' interfaces
and tested against doubles of their host pools. Both follow the engines'
failure contract: a storage call never raises on a daemon error (an
exception escaping a storage call ends SGLang's prefetch thread, which is
never restarted); it answers a miss, logs the outage once, and the next call
after ``retry_interval`` seconds dials the daemon again.
"""
