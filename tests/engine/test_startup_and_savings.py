"""A compare's start-up is not a stage, and the encoder time saved is each package's own (issue 40, item 4).

The first compare of an engine loads its model (imports and weights: seconds on a real model). Booked
to the first stage that touched the backend, it read "candidate encode 4 s" for an encode of 100 ms;
it is ``timings_ms["startup"]`` now, and only in the compare that loaded the model. Every cache hit
credits the encode its own package cost, so repeating candidates adds their own encode times once
per hit, never another package's.
"""

from __future__ import annotations

import pytest

from refsight import Engine


@pytest.fixture()
def engine(tmp_path, bundled_photos):
    with Engine(tmp_path / "store", model="toy") as engine:
        for name in ("chelsea", "coffee"):
            engine.add(bundled_photos[name], ref_id=name)
        yield engine


@pytest.fixture()
def bundled_photos():
    from refsight.samples import sample_paths

    return sample_paths()


def test_the_first_compare_reports_the_models_load_as_startup_and_the_next_does_not(tmp_path, bundled_photos):
    with Engine(tmp_path / "store", model="toy") as engine:
        engine.add(bundled_photos["chelsea"], ref_id="chelsea")  # add loads the model: a later compare has no startup
        assert engine.models.is_loaded()
        again = engine.compare(bundled_photos["astronaut"], ref_ids=["chelsea"], criteria="is a cat")
        assert "startup" not in again.timings_ms
    with Engine(tmp_path / "store", model="toy") as reopened:  # a new engine: its first compare loads the model
        assert not reopened.models.is_loaded()
        first = reopened.compare(bundled_photos["astronaut"], ref_ids=["chelsea"], criteria="is a cat")
        second = reopened.compare(bundled_photos["rocket"], ref_ids=["chelsea"], criteria="is a cat")
    stages = list(first.timings_ms)
    assert stages[0] == "startup" and "candidate_encode" in stages  # start-up first, then the stages as before
    assert "startup" not in second.timings_ms


def test_repeated_candidates_credit_each_packages_own_encode_time_once_per_hit(engine, bundled_photos):
    from refsight.inputs.images import load_image

    context = engine.context()
    before = engine.stats()
    first = {name: engine.packages.candidate(context, load_image(bundled_photos[name])) for name in ("astronaut", "rocket")}
    assert not any(found.cached for found in first.values())
    repeats = {"astronaut": 3, "rocket": 2}
    for name, times in repeats.items():
        for _ in range(times):
            hit = engine.packages.candidate(context, load_image(bundled_photos[name]))
            assert hit.cached and hit.package.encode_ms == first[name].package.encode_ms
    after = engine.stats()
    saved = after.encode_ms_saved - before.encode_ms_saved
    expected = sum(times * first[name].package.encode_ms for name, times in repeats.items())
    assert after.hits - before.hits == 5
    assert saved == pytest.approx(expected, abs=0.01)
