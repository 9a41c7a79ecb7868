"""KV-offload integrations of tensorcast with inference engines.

- :mod:`tensorcast.integrations.sglang`: SGLang's HiCache storage backend,
  loaded by its ``dynamic`` storage backend and built on its
  ``HiCacheStorage`` when SGLang is importable; its host pool in SGLang's
  shared memory moves without a staging copy.
- :mod:`tensorcast.integrations.vllm`: vLLM's ``OffloadingSpec``, with its
  manager and (:mod:`~tensorcast.integrations.vllm_worker`) its workers'
  handlers, built on vLLM's classes when vLLM is importable.

Without their engines they are duck-typed to the engines' interfaces, and
tested against doubles of the engines' host pools and stand-ins of their
modules. Both follow the engines'
failure contract: a storage call never raises on a daemon error (an
exception escaping a storage call ends SGLang's prefetch thread, which is
never restarted); it answers a miss, logs the outage once, and the next call
after ``retry_interval`` seconds dials the daemon again.
"""
