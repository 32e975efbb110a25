"""Issue 25 item 10, directed: a reference package and its prefix state damaged on disk; each compare
runs in a new process (nothing in memory), on the real tiny Qwen2-VL (the HF prefix cache).

The compare must re-encode the reference, write the repaired package back, rebuild the prefix
state and leave ``verify`` clean; the counters say what happened. A prefix state that is fine
must never stand in for a corrupt package: the package is still checked and repaired.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from refsight import Engine

MODEL = "tiny-qwen2-vl"
RUBRIC = "striped fur\npointed ears"

#: One compare in a fresh process: its results, the store's counters and what verify finds.
_COMPARE = textwrap.dedent(
    """
    import json, sys
    from refsight import Engine

    store, candidate = sys.argv[1], sys.argv[2]
    with Engine(store, model="tiny-qwen2-vl") as engine:
        out = engine.compare(candidate, criteria=sys.argv[3], ref_ids=["chelsea"], attributes=(), evidence_max_chars=4)
        stats = engine.stats().to_dict()
        verify = engine.verify().to_dict()
    print(json.dumps({"results": out.to_dict()["results"], "stats": stats, "verify": verify}))
    """
)


def _compare_in_a_new_process(store: Path, candidate: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _COMPARE, str(store), str(candidate), RUBRIC], capture_output=True, text=True, timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])  # same size, other bytes
    path.write_bytes(bytes(data))


def _verdicts(out: dict) -> list:
    return [row["criteria"] for row in out["results"]]


def _counts(stats: dict) -> dict:
    return {name: stats[name] for name in ("hits", "misses", "corrupt", "prefix_hits", "prefix_misses", "prefix_corrupt")}


@pytest.fixture
def store(tmp_path, real_photo) -> tuple[Path, Path, dict]:
    """A store holding chelsea and her prefix state, built by one compare; the candidate's path; that compare."""
    reference, candidate = tmp_path / "chelsea.png", tmp_path / "astronaut.png"
    real_photo("chelsea", size=(64, 48)).save(reference)
    real_photo("astronaut", size=(56, 56)).save(candidate)
    with Engine(tmp_path / "store", model=MODEL) as engine:
        engine.add(reference, ref_id="chelsea")
    first = _compare_in_a_new_process(tmp_path / "store", candidate)
    # misses: the reference's encode at add, the candidate's (memory only, so once per process)
    assert _counts(first["stats"]) == {"hits": 1, "misses": 2, "corrupt": 0, "prefix_hits": 0, "prefix_misses": 1,
                                       "prefix_corrupt": 0}
    return tmp_path / "store", candidate, first


def _files(store: Path) -> tuple[Path, Path]:
    (package,) = (store / "packages").rglob("*.safetensors")
    (state,) = (store / "prefixes").rglob("*.safetensors")
    return package, state


def test_a_damaged_package_and_prefix_state_are_rebuilt_and_verify_is_clean(store):
    root, candidate, first = store
    package, state = _files(root)
    _damage(package)
    _damage(state)
    with Engine(root, model=MODEL) as engine:
        assert not engine.verify().ok  # the damage is real: verify sees it before the compare
    repaired = _compare_in_a_new_process(root, candidate)
    assert _verdicts(repaired) == _verdicts(first)  # the same verdicts from the re-encoded package
    assert repaired["results"][0]["reference_cached"] is False
    # one more miss for the candidate, one for the reference re-encoded from its kept image
    assert _counts(repaired["stats"]) == {"hits": 1, "misses": 4, "corrupt": 1, "prefix_hits": 0, "prefix_misses": 2,
                                          "prefix_corrupt": 1}
    assert repaired["verify"]["corrupt"] == [] and repaired["verify"]["checked"] == 1  # written back, whole
    again = _compare_in_a_new_process(root, candidate)
    assert _verdicts(again) == _verdicts(first) and again["results"][0]["reference_cached"] is True
    assert _counts(again["stats"]) == {"hits": 2, "misses": 5, "corrupt": 1, "prefix_hits": 1, "prefix_misses": 2,
                                       "prefix_corrupt": 1}  # the repaired package and rebuilt state are served


def test_a_good_prefix_state_never_hides_a_corrupt_package(store):
    root, candidate, first = store
    package, _ = _files(root)
    _damage(package)
    repaired = _compare_in_a_new_process(root, candidate)
    assert _verdicts(repaired) == _verdicts(first) and repaired["results"][0]["reference_cached"] is False
    counts = _counts(repaired["stats"])
    assert (counts["corrupt"], counts["misses"], counts["prefix_hits"]) == (1, 4, 1)  # checked, re-encoded; state reused
    assert repaired["verify"]["corrupt"] == []
