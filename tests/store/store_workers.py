"""Subprocess workers for the crash and concurrency tests (run as ``python _workers.py MODE ...``)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from store_helpers import fingerprint, image_hash, make_package  # noqa: E402

from refsight.store import open_store  # noqa: E402


def writer(root: str, count: int, hang_after: int) -> None:
    """Write ``count`` packages, printing each key once it is stored.

    With ``hang_after >= 0``, the write after that many stops forever right after
    its rename, before its index row is committed (the test then SIGKILLs us).
    """
    import refsight.store._files as files

    store = open_store(root)
    done = 0
    if hang_after >= 0:
        real_publish = files.publish

        def publish_then_hang(temp, final):
            real_publish(temp, final)
            if done >= hang_after:
                print(f"RENAMED {final.name}", flush=True)
                time.sleep(3600)

        files.publish = publish_then_hang  # the one publish path's rename
    for i in range(count):
        package = make_package(i, tokens=64, dims=256)
        store.packages.put(package)
        done += 1
        print(f"PUT {package.key}", flush=True)


def concurrent(root: str, worker: int, rounds: int) -> None:
    """Wait for ``go`` on stdin, then add shared and private packages and references, and bump counters."""
    store = open_store(root)
    print("READY", flush=True)
    assert sys.stdin.readline().strip() == "go"
    fp = fingerprint()
    for i in range(rounds):
        for n, ref_id in ((i, f"shared-{i}"), (1000 * (worker + 1) + i, f"w{worker}-{i}")):
            package = make_package(n)
            store.catalog.put_image(image_hash(n), f"bytes of image {n}".encode(), "PNG")
            store.packages.put(package)
            store.catalog.add_reference(ref_id, image_hash(n), {"worker": worker})
            store.catalog.link_package(ref_id, fp.digest, package.key)
            store.catalog.bump(hits=1, encode_ms_saved=2.5)
    store.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "writer":
        writer(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    elif mode == "concurrent":
        concurrent(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    else:
        raise SystemExit(f"unknown mode {mode}")
