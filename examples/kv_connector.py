#!/usr/bin/env python3
"""A KV-cache connector on tensorcast's block store, on CPU torch tensors.

What an inference engine's connector does with the daemon, end to end:

1. Request A is prefilled: its KV cache (layers x K/V x heads x head_dim per
   token, bfloat16) is cut into blocks of --block-tokens tokens, and each
   block is saved under a chained block hash: sha256 of the previous block's
   hash and the block's token ids, so a block's key names its whole prefix.
   The blocks the store does not have yet are saved zero-copy: reserved in
   the daemon's pool, written there in place, committed.
2. Request B shares the first --shared fraction of A's tokens, then
   diverges. The connector hashes B's blocks the same way, looks up the
   longest cached prefix (pinning it in the same call, so it cannot be
   evicted before it is read), and loads the hit blocks back zero-copy:
   views straight into the daemon's pool, copied once into B's KV cache.
3. It checks the loaded blocks against A's, and prints the hit rate and
   the GB/s of the save and of the load.

Run it against `make run`'s daemon (socket ./run/tensorcastd.sock, or
$TENSORCAST_SOCKET):

    make run &                      # in another terminal
    python3 examples/kv_connector.py

It needs torch (Debian: apt install python3-torch; elsewhere: pip install
torch) and the tensorcast package: installed (pip install ./python), or else
this checkout's python/ directory, which it then puts on sys.path.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import warnings
from typing import List

try:
    import torch
except ImportError:
    sys.exit("kv_connector: this example needs torch, which this Python lacks: on Debian `apt install "
             "python3-torch` (and run it with /usr/bin/python3), elsewhere `pip install torch`")

try:
    import tensorcast
except ImportError as e:
    _checkout = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "python")
    if e.name != "tensorcast" or not os.path.isdir(os.path.join(_checkout, "tensorcast")):
        raise
    sys.path.insert(0, os.path.normpath(_checkout))  # not installed: this checkout's package
    import tensorcast


def block_hashes(tokens: List[int], block_tokens: int, namespace: bytes) -> List[bytes]:
    """The chained hash of each whole block of tokens."""
    out, prev = [], namespace
    for i in range(0, len(tokens) - block_tokens + 1, block_tokens):
        h = hashlib.sha256(prev)
        for t in tokens[i:i + block_tokens]:
            h.update(t.to_bytes(4, "little"))
        prev = h.digest()
        out.append(prev)
    return out


def prefill(tokens: List[int], per_token: int, seed: int) -> torch.Tensor:
    """A stand-in for the model: each token's KV is a function of its
    position's token prefix (here, of a seed and the token ids)."""
    g = torch.Generator().manual_seed(seed)
    kv = torch.empty(len(tokens), per_token // 2, dtype=torch.bfloat16)
    kv.normal_(generator=g)
    return kv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", default=os.environ.get("TENSORCAST_SOCKET") or "run/tensorcastd.sock",
                    help="the daemon's socket ($TENSORCAST_SOCKET, else ./run/tensorcastd.sock)")
    ap.add_argument("--prompt-tokens", type=int, default=2048)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--shared", type=float, default=0.75, help="the fraction of A's tokens B starts with")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    per_token = args.layers * 2 * args.heads * args.head_dim * 2  # K and V, bfloat16
    block_bytes = per_token * args.block_tokens
    namespace = f"kv-demo/{args.layers}x{args.heads}x{args.head_dim}".encode()
    g = torch.Generator().manual_seed(args.seed)
    tokens_a = torch.randint(0, 32000, (args.prompt_tokens,), generator=g).tolist()
    shared = int(args.prompt_tokens * args.shared)
    tokens_b = tokens_a[:shared] + torch.randint(32000, 64000, (args.prompt_tokens - shared,), generator=g).tolist()

    try:
        c = tensorcast.connect(args.socket, "kv_connector")
    except tensorcast.Error as e:
        print(f"kv_connector: {e} (start the daemon with `make run`, or set TENSORCAST_SOCKET)", file=sys.stderr)
        return 1
    with c:
        # 1. Request A: prefill, then save its blocks zero-copy.
        hashes_a = block_hashes(tokens_a, args.block_tokens, namespace)
        kv_a = prefill(tokens_a, per_token, args.seed)
        blocks_a = kv_a[:len(hashes_a) * args.block_tokens].view(len(hashes_a), -1)
        t0 = time.perf_counter()
        present = c.exists(hashes_a)
        new = [i for i, p in enumerate(present) if not p]
        stored = 0
        if new:
            # A copy that fails leaves the with block by an exception: the
            # reservation is then aborted, its pool blocks free at once.
            with c.reserve([hashes_a[i] for i in new], block_bytes) as r:
                for i, v in zip(new, r.views):
                    if v is not None:
                        torch.frombuffer(v, dtype=torch.bfloat16).copy_(blocks_a[i])
                codes = r.commit()
            stored = sum(s == tensorcast.Status.OK for s in codes)
            failed = [s for s in codes if s not in (tensorcast.Status.OK, tensorcast.Status.ALREADY_EXISTS)]
            if failed:
                print(f"kv_connector: {len(failed)} blocks not stored ({failed[0].name})", file=sys.stderr)
        save_s = time.perf_counter() - t0
        saved = stored * block_bytes
        print(f"kv_connector: request A: {len(hashes_a)} blocks of {block_bytes >> 10} KiB, {stored} saved zero-copy, "
              f"{len(hashes_a) - len(new)} already cached; {saved / 2**20:.1f} MiB in {save_s * 1e3:.1f} ms: "
              f"{saved / save_s / 1e9 if saved else 0:.2f} GB/s")

        # 2. Request B: the longest cached prefix, pinned, then loaded in place.
        hashes_b = block_hashes(tokens_b, args.block_tokens, namespace)
        kv_b = torch.zeros(len(hashes_b), block_bytes // 2, dtype=torch.bfloat16)  # B's KV cache, touched
        t0 = time.perf_counter()
        hit = c.lookup_prefix(hashes_b, pin=True)
        try:
            with c.get_pinned(hashes_b[:hit]) as views, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch notes that the views are read-only
                for i, v in enumerate(views):
                    if v is None:
                        raise SystemExit(f"kv_connector: block {i} of the pinned prefix is missing: {views.codes[i]}")
                    kv_b[i].copy_(torch.frombuffer(v, dtype=torch.bfloat16))
        finally:
            if hit:
                c.release(hashes_b[:hit])  # the lookup's pins
        load_s = time.perf_counter() - t0
        loaded = hit * block_bytes

        # 3. The loaded blocks are A's, byte for byte.
        ok = torch.equal(kv_b[:hit], blocks_a[:hit])
        expect = shared // args.block_tokens
        rate = hit / len(hashes_b) if hashes_b else 0.0
        print(f"kv_connector: request B: {hit} of {len(hashes_b)} blocks cached (hit rate {rate:.1%}, "
              f"{expect} expected), loaded {loaded / 2**20:.1f} MiB zero-copy in {load_s * 1e3:.1f} ms: "
              f"{loaded / load_s / 1e9 if loaded else 0:.2f} GB/s; {'verified' if ok else 'MISMATCH'}")
        if not ok or hit < expect:
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
