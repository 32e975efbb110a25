"""Concurrent requests for the same new image encode it once, across threads and tenants."""

from __future__ import annotations

import threading

from refsight import Engine, open_store
from refsight.backends.registry import register_backend
from refsight.backends.toy import ToyBackend
from refsight.support.locks import KeyedLocks


class SlowToy(ToyBackend):
    """The toy encoder, slowed so that racing threads really overlap."""

    def encode(self, images):
        threading.Event().wait(0.05)
        return super().encode(images)


def test_same_new_image_added_by_many_threads_and_tenants_is_encoded_once(tmp_path, real_photo, backend_registry):
    backend = SlowToy("slow-toy")
    register_backend("slow-toy", lambda name: backend)
    image = real_photo("coffee", size=(40, 30))
    with open_store(tmp_path / "store") as store:
        engines = [Engine(store, model="slow-toy", namespace=f"tenant{i % 2}") for i in range(8)]
        barrier = threading.Barrier(len(engines))
        results = []

        def add(engine: Engine) -> None:
            barrier.wait()
            results.append(engine.add(image, ref_id="same"))

        threads = [threading.Thread(target=add, args=(engine,)) for engine in engines]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert backend.images_encoded == 1
        assert sorted(r.cached for r in results) == [False] + [True] * 7
        assert len({r.package_key for r in results}) == 1


def test_keyed_locks_forget_keys_nobody_holds():
    locks = KeyedLocks()
    with locks.hold("a"), locks.hold("b"):
        assert len(locks) == 2
    assert len(locks) == 0
