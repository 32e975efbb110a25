"""The llama.cpp KV prefix cache: the reference prefix's sequence state, reused across rubrics and processes.

For every built-in GGUF family, 1 and 3 references, 3 rubrics: the judge prompt with
the prefix cache (the state built here, saved to the store's disk tier, then restored
from disk in a NEW process with ``llama_state_seq_set_data``) gives the same greedy
tokens as without it, and logits with max |Δ| exactly 0. In the new process every
request restores the state and evaluates only the rest of the prompt: zero reference
prefill, no reference image chunk decoded. A corrupted or truncated state file is
detected by the store and rebuilt; a state llama.cpp refuses is discarded and rebuilt;
neither is ever used.
"""

from __future__ import annotations

import pytest
from llama_models import GGUF_FAMILIES, require_llama_cpp
from llama_workers import run_worker
from worker_spec import stored_keys

require_llama_cpp()

REFS = ("chelsea", "coffee", "astronaut")
RUBRICS = ("same colour", "a round shape", "short fur and pointed ears")

from _llamacpp_prefix_worker import judge_request, run  # noqa: E402


@pytest.fixture(scope="module")
def results(gguf, photos, tmp_path_factory):
    """Here: without the cache, and with it (building and saving states). New process: from disk."""
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    tmp = tmp_path_factory.mktemp("llama-prefix")
    candidate_png = tmp / "candidate.png"
    photos["rocket"].image.save(candidate_png)
    here: dict[str, dict] = {}
    cases = []
    with open_store(tmp / "store") as store:
        cache = PrefixStateCache(store)
        for name in GGUF_FAMILIES:
            backend = gguf(name)
            packages = backend.encode([photos[r] for r in REFS])
            keys = stored_keys(store, packages)
            for n in (1, 3):
                case = f"{name}/{n}"
                here[case] = {
                    "plain": [run(backend, judge_request(packages[:n], photos["rocket"], r, None)) for r in RUBRICS],
                    "cached": [run(backend, judge_request(packages[:n], photos["rocket"], r, cache)) for r in RUBRICS],
                }
                cases.append({"id": case, "model": name, "refs": keys[:n], "candidate": str(candidate_png),
                              "rubrics": list(RUBRICS)})
    return here, run_worker("_llamacpp_prefix_worker.py", tmp, cases)


@pytest.mark.parametrize("n_refs", (1, 3))
@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_prefix_cache_is_bit_identical_in_this_and_a_new_process(results, name, n_refs):
    here, disk = results
    case = f"{name}/{n_refs}"
    for plain, cached, loaded in zip(here[case]["plain"], here[case]["cached"], disk[case]):
        assert plain["tokens"] == cached["tokens"] == loaded["tokens"]
        assert (plain["logits"] - cached["logits"]).abs().max().item() == 0.0
        assert (plain["logits"] - loaded["logits"]).abs().max().item() == 0.0
        assert plain["prompt_tokens"] == loaded["prompt_tokens"]


@pytest.mark.parametrize("n_refs", (1, 3))
@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_a_reused_prefix_runs_no_reference_prefill(results, name, n_refs):
    here, disk = results
    case = f"{name}/{n_refs}"
    plain = here[case]["plain"][0]
    # Without the cache: every reference chunk decoded from its package, the fresh candidate encoded too.
    assert plain["image_decodes"] > plain["encodes"] > 0
    first, *later = here[case]["cached"]
    assert first["restores"] == 0 and first["cached_tokens"] == 0  # built here
    for r in [*later, *disk[case]]:  # second and third rubric here, every rubric in the new process
        assert r["restores"] == 1
        assert r["cached_tokens"] > 0
        # Only what follows the prefix went through the language model ...
        assert r["decoded"] == r["prompt_tokens"] - r["cached_tokens"] < plain["decoded"]
        # ... and the only image chunks decoded are the candidate's (encoded: a fresh image).
        assert r["image_decodes"] == r["encodes"] == plain["encodes"]


@pytest.fixture(scope="module")
def small(gguf, photos):
    """tiny-qwen2-vl-gguf, two reference packages, and the plain (no cache) result of one rubric."""
    backend = gguf("tiny-qwen2-vl-gguf")
    packages = backend.encode([photos[r] for r in REFS[:2]])
    return backend, packages, run(backend, judge_request(packages, photos["rocket"], RUBRICS[0], None))


@pytest.mark.parametrize("damage", ("flip", "truncate"))
def test_a_corrupted_or_truncated_state_file_is_detected_and_rebuilt(small, photos, tmp_path, damage):
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    backend, packages, plain = small
    request = lambda cache: judge_request(packages, photos["rocket"], RUBRICS[0], cache)  # noqa: E731
    with open_store(tmp_path / "store") as store:
        run(backend, request(PrefixStateCache(store)))
        (path,) = list((tmp_path / "store" / "prefixes").rglob("*.safetensors"))
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF  # one byte of the KV data: only the checksum can tell
    else:
        data = data[: len(data) - 1000]
    path.write_bytes(bytes(data))
    with open_store(tmp_path / "store") as store:  # a new store object: nothing in memory
        cache = PrefixStateCache(store)
        rebuilt = run(backend, request(cache))
        assert rebuilt["restores"] == 0 and rebuilt["cached_tokens"] == 0  # never used ...
        assert rebuilt["tokens"] == plain["tokens"]
        assert (rebuilt["logits"] - plain["logits"]).abs().max().item() == 0.0
        store.prefixes.clear_memory()
        again = run(backend, request(cache))  # ... and rebuilt: the new file serves the next request
        assert again["restores"] == 1 and again["tokens"] == plain["tokens"]
        assert (again["logits"] - plain["logits"]).abs().max().item() == 0.0


class _Refused:
    """A prefix cache serving a state llama.cpp cannot load (a valid file of a damaged blob)."""

    def __init__(self) -> None:
        self.states: dict = {}
        self.discarded: list[str] = []

    def get(self, key):
        return self.states.get(key)

    def put(self, key, state):
        self.states[key] = state

    def discard(self, key):
        self.discarded.append(key)
        self.states.pop(key, None)


def test_a_state_llama_cpp_refuses_is_discarded_and_rebuilt(small, photos):
    from refsight.backends.prefix import PrefixState

    backend, packages, plain = small
    cache = _Refused()
    run(backend, judge_request(packages, photos["rocket"], RUBRICS[0], cache))
    ((key, state),) = cache.states.items()
    blob = state.tensors["state"]
    cache.states[key] = PrefixState({"state": blob[: blob.numel() // 2].clone()}, state.meta, state.tokens, state.build_ms)
    result = run(backend, judge_request(packages, photos["rocket"], RUBRICS[0], cache))
    assert cache.discarded == [key]
    assert result["restores"] == 0 and result["tokens"] == plain["tokens"]
    assert (result["logits"] - plain["logits"]).abs().max().item() == 0.0
    assert cache.states[key].tensors["state"].numel() == blob.numel()  # rebuilt and offered again


def test_no_kv_cache_opt_out_and_fresh_images_build_no_state(small, photos):
    """A request without a prefix cache, or whose prefix holds a fresh image, neither reads nor writes a state."""
    backend, packages, plain = small
    cache = _Refused()
    fresh = run(backend, judge_request([photos[r] for r in REFS[:2]], photos["rocket"], RUBRICS[0], cache))
    assert cache.states == {} and fresh["restores"] == 0
    assert fresh["tokens"] == plain["tokens"]


def test_compare_reuses_the_prefix_by_default_and_no_kv_cache_opts_out(gguf, photos, tmp_path):
    """Engine.compare on llama.cpp: a second rubric is served from stored prefix states, same verdicts as without."""
    from refsight import Engine

    gguf("tiny-qwen2-vl-gguf")
    with Engine(tmp_path / "store", model="tiny-qwen2-vl-gguf") as engine:
        for name in REFS[:2]:
            engine.add(photos[name].image, ref_id=name)
        kwargs = dict(ref_ids=list(REFS[:2]), attributes=[], evidence_max_chars=16)
        engine.compare(photos["rocket"].image, criteria=RUBRICS[0], **kwargs)
        built = engine.stats()
        assert built.prefix_misses == 2 and built.prefix_hits == 0  # one state per reference
        reused = engine.compare(photos["rocket"].image, criteria=RUBRICS[1], **kwargs).to_dict()
        assert engine.stats().prefix_hits == 2
        plain = engine.compare(photos["rocket"].image, criteria=RUBRICS[1], prefix_states=False, **kwargs).to_dict()
        assert engine.stats().prefix_hits == 2 and engine.stats().prefix_misses == 2  # opted out: not asked
    assert [r["criteria"] for r in reused["results"]] == [r["criteria"] for r in plain["results"]]
