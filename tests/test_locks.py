"""The readers-writer lock: readers overlap, a writer runs alone, a waiting writer is not starved."""

from __future__ import annotations

import threading
import time

from refsight.support.locks import ReadWriteLock


def test_readers_hold_the_lock_at_the_same_time():
    lock = ReadWriteLock()
    both_inside = threading.Barrier(2, timeout=5)  # breaks unless two readers are inside at once
    errors = []

    def read():
        with lock.reading():
            try:
                both_inside.wait()
            except threading.BrokenBarrierError as exc:
                errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_a_writer_excludes_readers_and_other_writers():
    lock = ReadWriteLock()
    inside, log = threading.Event(), []

    def write(name):
        with lock.writing():
            log.append(f"{name} in")
            inside.set()
            time.sleep(0.2)
            log.append(f"{name} out")

    def read():
        with lock.reading():
            log.append("reader")

    first = threading.Thread(target=write, args=("w1",))
    first.start()
    assert inside.wait(5)
    others = [threading.Thread(target=read), threading.Thread(target=write, args=("w2",))]
    for t in others:
        t.start()
    for t in [first, *others]:
        t.join()
    assert log[:2] == ["w1 in", "w1 out"]  # nobody got in while w1 held it
    assert log.index("w2 out") == log.index("w2 in") + 1


def test_a_waiting_writer_holds_back_readers_that_arrive_after_it():
    lock = ReadWriteLock()
    log = []
    reader_in, release_reader = threading.Event(), threading.Event()

    def long_read():
        with lock.reading():
            reader_in.set()
            release_reader.wait(5)

    def write():
        with lock.writing():
            log.append("writer")

    def late_read():
        with lock.reading():
            log.append("late reader")

    holder = threading.Thread(target=long_read)
    holder.start()
    assert reader_in.wait(5)
    writer = threading.Thread(target=write)
    writer.start()
    while not lock._writers_waiting:  # the writer is queued behind the first reader
        time.sleep(0.01)
    late = threading.Thread(target=late_read)
    late.start()
    time.sleep(0.2)
    assert log == []  # the late reader did not slip in ahead of the waiting writer
    release_reader.set()
    for t in (holder, writer, late):
        t.join()
    assert log == ["writer", "late reader"]
