"""The KV prefix cache on the transformers backends: equal to the fresh path, built once, never wrong.

(a) **Equivalence from disk in a new process.** For every tiny family, 1 and 3 references and
3 rubrics (judge layout: references, candidate, rubric): the states are built here and written
to the store's ``prefixes/``; a NEW process reads them back from disk and generates. Greedy
tokens must equal this process's fresh path (no prefix cache) and the logits' max |Δ| stay
under :data:`LOGITS_BOUND`. The difference is not 0: the cached path multiplies the suffix
against a cache of N keys instead of one (N+M)-long prompt, so GEMM shapes (and float
summation order) differ; measured here ≤ 1.2e-7 (fp32, CPU), asserted ≤ 1e-5.
(b) **Counted.** A second rubric against the same references runs the language model over
the suffix tokens only: its first forward takes ``prompt_tokens - prefix_tokens_reused`` tokens and
``prefix_tokens_reused`` covers every reference image token.
(c) **Corrupt or truncated state files** are detected, deleted and rebuilt, never used.
(d) **Hybrid language models** (Qwen3.5's Gated DeltaNet layers, Gemma 4's KV-shared layers): a state
holds each layer kind's own tensors (a linear layer's convolution and recurrent state), is never written
by the requests it serves, and a state that does not fit is rebuilt. Measured in (a): ≤ 1.5e-7 on
Qwen3.5 and Qwen3.5-MoE, ≤ 2.1e-6 on Gemma 4 (logits of magnitude ~0.6), greedy tokens identical.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from backend_models import ALL_FAMILIES as TINY_FAMILIES

REFS = ("chelsea", "coffee", "astronaut")
CANDIDATE = "rocket"
RUBRICS = (
    "Criteria:\n1. \"same colour\"\nAnswer with JSON.",
    "Criteria:\n1. \"long fur\"\n2. \"pointed ears\"\nAnswer with JSON only, in this form.",
    "Is the candidate the same object as the references?",
)
MAX_NEW_TOKENS = 6
#: Measured ≤ 1.2e-7 on every family (fp32, CPU); asserted with headroom for other BLAS builds.
LOGITS_BOUND = 1e-5
WORKER = Path(__file__).with_name("_prefix_worker.py")


def _requests(refs, candidate, rubrics, cache):
    from refsight.requests import GenerationRequest
    from refsight.judge.prompts import reference_prefix

    prefix = reference_prefix(refs)
    return [
        GenerationRequest(
            [*prefix, "Candidate:", candidate, "\n", rubric], max_new_tokens=MAX_NEW_TOKENS,
            prefix_segments=len(prefix), prefix_cache=cache,
        )
        for rubric in rubrics
    ]


def _max_diff(a, b) -> float:
    steps = min(a.shape[0], b.shape[0])
    return float((a[:steps] - b[:steps]).abs().max())


@pytest.fixture(scope="module")
def from_disk(load, photos, tmp_path_factory):
    """Fresh results here; states built here; the cached path run from disk in a new process."""
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    from refsight.backends.hf.prefix_cache import usable_cache

    tmp = tmp_path_factory.mktemp("prefix")
    fresh, cases = {}, []
    with open_store(tmp / "store") as store:
        cache = PrefixStateCache(store)
        for name in TINY_FAMILIES:
            backend = load(name)
            if name in NO_PREFIX:
                continue  # test_families_without_a_prefix_fall_back_to_the_fresh_path
            assert usable_cache(backend), name
            packages = backend.encode([photos[r] for r in (*REFS, CANDIDATE)])
            for package in packages:
                store.packages.put(package)
            refs, candidate = packages[:3], packages[3]
            for n in (1, 3):
                case = f"{name}/{n}"
                fresh[case] = backend.generate(_requests(refs[:n], candidate, RUBRICS, None), return_logits=True)
                # Build the state (one rubric: it depends on the references only) and write it to disk.
                built = backend.generate(_requests(refs[:n], candidate, RUBRICS[:1], cache), return_logits=True)
                assert built[0].prefix_tokens_reused == 0 and built[0].token_ids == fresh[case][0].token_ids
                cases.append({
                    "id": case, "model": name, "refs": [p.key for p in refs[:n]], "candidate": candidate.key,
                    "rubrics": list(RUBRICS), "max_new_tokens": MAX_NEW_TOKENS,
                })
        assert store.prefixes.stats()["prefixes"] == len(cases)
    spec = tmp / "spec.json"
    out = tmp / "cached.pt"
    spec.write_text(json.dumps({"store": str(tmp / "store"), "cases": cases, "out": str(out), "threads": torch.get_num_threads()}))
    proc = subprocess.run([sys.executable, str(WORKER), str(spec)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return fresh, torch.load(out, weights_only=False)


#: Families whose template moves a turn's images before its text (LLaVA's, Emu3's, PaliGemma's processor): the
#: references are no head of the prompt, so there is no prefix to keep. Every other family keeps prefix
#: states: sliding windows (Gemma 3, Cohere 2's Aya Vision), Gated DeltaNet layers (Qwen3.5, Qwen3.5-MoE,
#: MiniCPM-V 4.6's language model) and KV-shared layers (Gemma 4, the encoder-free gemma4_unified) included.
IMAGES_FIRST = ("tiny-llava", "tiny-llava-next", "tiny-llava-onevision", "tiny-paligemma", "tiny-vipllava", "tiny-video-llava",
                "tiny-llava-next-video", "tiny-emu3")
#: Families with a language-model layer whose state prefix_cache cannot keep (LFM2's and LFM3's short
#: convolutions), or whose references' state depends on what follows them (Molmo 2: every image token attends
#: to every image of the prompt): they run the plain path.
UNKEPT = ("tiny-lfm3-vl", "tiny-lfm2-vl", "tiny-molmo2")
NO_PREFIX = IMAGES_FIRST + UNKEPT
#: The hybrid built-ins and each language-model layer's kind (hf/layer_states.py).
HYBRID_KINDS = {
    "tiny-qwen3.5": ["linear", "linear", "linear", "full"],
    "tiny-gemma4": ["sliding", "full", "shared", "shared"],
    "tiny-gemma4-unified": ["sliding", "full", "shared", "shared"],
}
PREFIX_FAMILIES = tuple(name for name in TINY_FAMILIES if name not in NO_PREFIX)


@pytest.mark.parametrize("name", NO_PREFIX)
def test_families_without_a_prefix_fall_back_to_the_fresh_path(load, photos, tmp_path, name):
    from refsight.backends.hf.prefix_cache import usable_cache
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    backend = load(name)
    assert usable_cache(backend) == (name not in UNKEPT)
    refs = backend.encode([photos[r] for r in REFS[:2]])
    candidate = backend.encode([photos[CANDIDATE]])[0]
    fresh = backend.generate(_requests(refs, candidate, RUBRICS[:2], None), return_logits=True)
    with open_store(tmp_path / "store") as store:
        got = backend.generate(_requests(refs, candidate, RUBRICS[:2], PrefixStateCache(store)), return_logits=True)
        assert store.prefixes.stats()["prefixes"] == 0
    for want, row in zip(fresh, got):
        assert row.token_ids == want.token_ids and row.prefix_tokens_reused == 0
        assert _max_diff(row.logits, want.logits) == 0.0


@pytest.mark.parametrize("n_refs", [1, 3])
@pytest.mark.parametrize("name", PREFIX_FAMILIES)
def test_prefix_state_from_disk_in_a_new_process_equals_the_fresh_path(from_disk, name, n_refs):
    fresh, cached = from_disk
    case = f"{name}/{n_refs}"
    rows = cached[case]["rows"]
    assert len(rows) == len(RUBRICS) == len(fresh[case])
    worst = 0.0
    for want, got in zip(fresh[case], rows):
        assert got["tokens"] == want.token_ids, case
        assert got["prompt"] == want.prompt_tokens
        assert got["cached"] > 0  # served from the state on disk, not rebuilt
        worst = max(worst, _max_diff(got["logits"], want.logits))
    print(f"{case}: greedy tokens identical, logits max |Δ| = {worst:.3g}")
    assert worst <= LOGITS_BOUND
    # Zero prefill over the references: no forward took more than the (padded) suffixes (a sliding-window
    # model may run the rows in parts, one forward over each part's suffixes).
    assert cached[case]["widest_forward_tokens"] == max(r["prompt"] - r["cached"] for r in rows)


def test_the_new_process_only_hit(from_disk):
    _, cached = from_disk
    counters = cached["counters"]
    assert counters.get("prefix_hits") == 2 * len(PREFIX_FAMILIES)  # one look-up per distinct prefix and call
    assert not counters.get("prefix_misses") and not counters.get("prefix_corrupt")


def _narrow_window(model_cache, tmp_path, name: str, window: int):
    """``name``'s built checkpoint with a sliding window of ``window`` tokens and a hybrid layer pattern
    (sliding, then full attention, as Gemma 3 alternates them), loaded as a local ``hf:`` model."""
    import shutil

    from refsight.backends.hf import load_hf_backend
    from refsight.builtin_models.checkpoints import ensure_model_dir

    directory = tmp_path / f"{name}-window-{window}"
    shutil.copytree(ensure_model_dir(name), directory)
    config = json.loads((directory / "config.json").read_text())
    config["text_config"].update(sliding_window=window, layer_types=["sliding_attention", "full_attention"])
    (directory / "config.json").write_text(json.dumps(config))
    return load_hf_backend(f"hf:{directory}", source=str(directory), random_weights=True)


@pytest.mark.parametrize("name", ["tiny-gemma3", "tiny-aya-vision"])
def test_a_prefix_longer_than_the_sliding_window_equals_the_fresh_path(model_cache, photos, tmp_path, name):
    """The sliding layers keep only the window's last tokens: a state over a longer prefix, in a batch
    of rubrics of different lengths, still gives the fresh path's tokens and logits."""
    from refsight.backends.hf.prefix_cache import state_layout
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    window = 8
    backend = _narrow_window(model_cache, tmp_path, name, window)
    assert state_layout(backend) == f":windows={window},full"  # the window is part of every state's key
    packages = backend.encode([photos[r] for r in (*REFS, CANDIDATE)])
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        for n in (1, 3):
            requests = lambda c: _requests(packages[:n], packages[3], RUBRICS, c)  # noqa: E731
            fresh = backend.generate(requests(None), return_logits=True)
            built = backend.generate(requests(cache), return_logits=True)
            served = backend.generate(requests(cache), return_logits=True)
            for f, b, s in zip(fresh, built, served):
                assert f.token_ids == b.token_ids == s.token_ids, (name, n)
                assert max(_max_diff(f.logits, b.logits), _max_diff(f.logits, s.logits)) <= LOGITS_BOUND
                assert b.prefix_tokens_reused == 0 and s.prefix_tokens_reused > window  # past the window
        counts = _counts(store)
        assert (counts["prefix_misses"], counts["prefix_hits"]) == (2, 2)  # one look-up per prefix and call


def _counts(store) -> dict[str, float]:
    """The store's persistent counters, this process's pending counts included."""
    store.counters.flush()
    return {"prefix_hits": 0, "prefix_misses": 0, "prefix_corrupt": 0, "prefix_ms_saved": 0, **store.catalog.counters()}


def _language_model(backend):
    base = backend.model.model
    return base.language_model if hasattr(base, "language_model") else base.text_model


@pytest.mark.parametrize("name", ["tiny-qwen2-vl", "tiny-smolvlm", "tiny-internvl", "tiny-mistral3", "tiny-qwen3.5",
                                  "tiny-gemma4"])
def test_a_second_rubric_runs_no_prefill_over_the_references(load, photos, tmp_path, name):
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    backend = load(name)
    packages = backend.encode([photos[r] for r in (*REFS, CANDIDATE)])
    refs, candidate = packages[:3], packages[3]
    image_ids = backend.image_token_ids
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        first = backend.generate(_requests(refs, candidate, RUBRICS[:1], cache))[0]
        seen: list[int] = []
        hook = _language_model(backend).register_forward_pre_hook(
            lambda m, a, kw: seen.append(int(kw["inputs_embeds"].shape[1])), with_kwargs=True
        )
        try:
            second = backend.generate(_requests(refs, candidate, RUBRICS[1:2], cache))[0]
        finally:
            hook.remove()
        fresh = backend.generate(_requests(refs, candidate, RUBRICS[1:2], None))[0]
        counts = _counts(store)
        assert (counts["prefix_misses"], counts["prefix_hits"]) == (1, 1) and counts["prefix_ms_saved"] > 0
    assert first.prefix_tokens_reused == 0 and second.prefix_tokens_reused > 0
    assert second.token_ids == fresh.token_ids
    # The state covers every reference image token (and the candidate's are all after it).
    ids = backend.tokenizer(backend.build_prompt(_requests(refs, candidate, RUBRICS[1:2], None)[0].segments),
                            add_special_tokens=False)["input_ids"]
    ref_image_tokens = sum(int(p.metadata["num_tokens"]) for p in refs)
    assert sum(t in image_ids for t in ids[: second.prefix_tokens_reused]) == ref_image_tokens
    # The language model ran over the suffix once, then one token per decoding step: nothing else.
    assert seen[0] == second.prompt_tokens - second.prefix_tokens_reused
    assert seen[1:] == [1] * (len(second.token_ids) - 1)


@pytest.mark.parametrize("damage", ["flip", "truncate", "other-key"])
def test_a_corrupt_or_truncated_state_file_is_rebuilt_never_used(load, photos, tmp_path, damage):
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    backend = load("tiny-qwen2-vl")
    packages = backend.encode([photos[r] for r in (*REFS, CANDIDATE)])
    refs, candidate = packages[:2], packages[3]
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        fresh = backend.generate(_requests(refs, candidate, RUBRICS[:1], None), return_logits=True)[0]
        backend.generate(_requests(refs, candidate, RUBRICS[:1], cache))
        (path,) = list((tmp_path / "store" / "prefixes").glob("*/*.safetensors"))
        data = bytearray(path.read_bytes())
        if damage == "flip":
            data[len(data) // 2] ^= 0x40  # one bit inside the key/value bytes
        elif damage == "truncate":
            data = data[: len(data) - 100]
        else:  # a well-formed state of another prefix, renamed over this one
            backend.generate(_requests(refs[:1], candidate, RUBRICS[:1], cache))
            other = next(p for p in path.parent.parent.glob("*/*.safetensors") if p != path)
            data = bytearray(other.read_bytes())
        path.write_bytes(bytes(data))
        store.prefixes.clear_memory()
        before = _counts(store)
        again = backend.generate(_requests(refs, candidate, RUBRICS[:1], cache), return_logits=True)[0]
        after = _counts(store)
        assert after["prefix_corrupt"] == before["prefix_corrupt"] + 1
        assert after["prefix_misses"] == before["prefix_misses"] + 1
        assert again.prefix_tokens_reused == 0  # rebuilt, not served
        assert again.token_ids == fresh.token_ids
        assert _max_diff(again.logits, fresh.logits) <= LOGITS_BOUND
        # The rebuilt file is whole again: the next request is served from it.
        store.prefixes.clear_memory()
        third = backend.generate(_requests(refs, candidate, RUBRICS[:1], cache))[0]
        assert third.prefix_tokens_reused > 0 and third.token_ids == fresh.token_ids


@pytest.mark.parametrize("name", ["tiny-qwen3-vl", "tiny-smolvlm", "tiny-qwen3.5"])
def test_one_batch_mixes_shared_and_different_prefixes_and_rows_without_one(load, photos, tmp_path, name):
    from refsight.requests import GenerationRequest
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    backend = load(name)
    packages = backend.encode([photos[r] for r in (*REFS, CANDIDATE)])
    refs, candidate = packages[:3], packages[3]
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)

        def batch(c):
            rows = _requests(refs[:2], candidate, RUBRICS[:2], c)  # two rubrics share one prefix ...
            rows += _requests(refs[:2], refs[2], RUBRICS[2:], c)  # ... with a third row: another candidate
            rows += _requests(refs[2:], candidate, RUBRICS[2:], c)  # another prefix, shorter
            rows.append(GenerationRequest(["Describe", candidate, "briefly."], max_new_tokens=MAX_NEW_TOKENS))
            return rows

        fresh = backend.generate(batch(None), return_logits=True)
        built = backend.generate(batch(cache), return_logits=True)
        served = backend.generate(batch(cache), return_logits=True)
        assert _counts(store)["prefix_misses"] == 2  # each distinct prefix built once
    for f, b, s in zip(fresh, built, served):
        assert f.token_ids == b.token_ids == s.token_ids
        assert max(_max_diff(f.logits, b.logits), _max_diff(f.logits, s.logits)) <= LOGITS_BOUND
    assert [g.prefix_tokens_reused > 0 for g in served] == [True, True, True, True, False]
    assert served[0].prefix_tokens_reused == served[1].prefix_tokens_reused == served[2].prefix_tokens_reused
    assert served[2].prefix_tokens_reused != served[3].prefix_tokens_reused


def test_without_a_prefix_cache_nothing_is_kept(load, photos, tmp_path):
    backend = load("tiny-qwen2-vl")
    packages = backend.encode([photos[r] for r in (*REFS, CANDIDATE)])
    out = backend.generate(_requests(packages[:1], packages[3], RUBRICS[:1], None))[0]
    assert out.prefix_tokens_reused == 0 and "prefix_build" not in out.timings_ms and "prefix_load" not in out.timings_ms


@pytest.mark.parametrize("name", sorted(HYBRID_KINDS))
def test_a_hybrid_state_holds_each_layer_kind_is_never_written_and_a_misfit_is_rebuilt(load, photos, tmp_path, name):
    from refsight.backends.hf.layer_states import expected_tensors, layer_kinds
    from refsight.backends.hf.prefix_cache import state_layout
    from refsight.backends.prefix import PrefixState
    from refsight.cache.prefix_states import PrefixStateCache
    from refsight.store import open_store

    backend = load(name)
    kinds = layer_kinds(backend)
    assert kinds == HYBRID_KINDS[name]
    # Which layers are linear is part of every key (the windows already were).
    assert (":linear=0,1,2" in state_layout(backend)) == ("linear" in kinds)
    packages = backend.encode([photos[r] for r in (*REFS, CANDIDATE)])
    requests = lambda c: _requests(packages[:2], packages[3], RUBRICS[:2], c)  # noqa: E731
    fresh = backend.generate(requests(None), return_logits=True)
    with open_store(tmp_path / "store") as store:
        cache = PrefixStateCache(store)
        backend.generate(requests(cache))
        (path,) = list((tmp_path / "store" / "prefixes").glob("*/*.safetensors"))
        key = path.stem
        state = cache.get(key)
        # Each layer's own tensors: keys/values for attention layers, convolution and recurrent state for
        # linear ones, nothing for KV-shared ones.
        want = expected_tensors(backend, kinds, state.tokens)
        assert set(state.tensors) == set(want)
        assert all(list(state.tensors[k].shape) == shape and state.tensors[k].dtype in dtypes for k, (shape, dtypes) in want.items())
        before = {k: t.clone() for k, t in state.tensors.items()}
        # Served twice from the memory tier (the same tensor objects): decoding updates its batch's cache in
        # place, never the stored state.
        for _ in range(2):
            served = backend.generate(requests(cache), return_logits=True)
            for f, s in zip(fresh, served):
                assert s.prefix_tokens_reused == state.tokens and s.token_ids == f.token_ids
                assert _max_diff(s.logits, f.logits) <= LOGITS_BOUND
        assert all(torch.equal(before[k], t) for k, t in state.tensors.items())
        # A state that lacks one layer's tensor (or has another shape) is discarded and rebuilt, never used.
        dropped = next(k for k in state.tensors if not k.startswith(("key.", "value."))) if "linear" in kinds else "key.1"
        cache.put(key, PrefixState({k: t for k, t in state.tensors.items() if k != dropped}, state.meta, state.tokens))
        rebuilt = backend.generate(requests(cache), return_logits=True)
        assert [r.prefix_tokens_reused for r in rebuilt] == [0, 0]
        assert [r.token_ids for r in rebuilt] == [f.token_ids for f in fresh]
        again = backend.generate(requests(cache))
        assert again[0].prefix_tokens_reused == state.tokens
