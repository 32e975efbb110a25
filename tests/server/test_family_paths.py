"""Every family the generic transformers backend serves, through every door a user has.

Per family (each tiny checkpoint loaded once per module): a compare through the engine gives the
same verdict JSON cached and with references re-encoded (the judge, constrained JSON); the yes/no
reranker scores the same from packages as from pixels; the ``vlm:`` embedder finds the references;
``refsight add`` / ``compare`` / ``generate`` run through the CLI; and a live server on loopback
takes a reference, a compare and an OpenAI SDK chat naming the stored reference.
"""

from __future__ import annotations

import json

import openai
import pytest

from refsight.builtin_models.family_checkpoints import FAMILY_SPECS
from refsight.families import FAMILIES
from compare_helpers import RUBRIC, cached_and_fresh, without_timings
from live_server import b64, data_url, photo_png
from refsight.cli import main
from refsight.compare.rerank import RerankQuery, VlmReranker

#: Every family but those shaped like one already here (``kin_recipes``: another tower or config on a known
#: layout, proven cached == fresh in tests/backends/test_families.py): the doors below are the same code for them,
#: and each family costs three model loads and a live server in CI.
#: Gemma 4 unified is Gemma 4's language model and state rules over a patch embedding: its doors are Gemma 4's.
SHAPED_LIKE_ONE_HERE = {f.model_type for f in FAMILIES.values() if f.transformers.recipe.startswith("kin_recipes.")} | {"gemma4_unified"}
DOOR_FAMILIES = tuple(name for name, spec in FAMILY_SPECS.items() if spec.model_type not in SHAPED_LIKE_ONE_HERE)


@pytest.mark.parametrize("model", DOOR_FAMILIES)
def test_judge_and_reranker_are_equal_cached_and_fresh(tmp_path, real_photo, model):
    with cached_and_fresh(tmp_path / "store", real_photo, model) as (engine, refs, candidate, cached, fresh):
        from refsight.inputs.images import load_image

        query = RerankQuery(image=load_image(candidate), criteria=("short fur",), text="short fur")
        references = [engine.reference(n) for n in refs]
        scores = VlmReranker(engine.context(), engine.packages).score(query, references)
        scores_fresh = VlmReranker(engine.context(use_cache=False), engine.packages).score(query, references)
    assert [r["reference_cached"] for r in cached["results"]] == [True, True]
    assert without_timings(cached) == without_timings(fresh)
    assert cached["random_weights"] is True
    for result in cached["results"]:
        assert [c["criterion"] for c in result["criteria"]] == ["short fur", "triangular ears"]
        assert all(c["verdict"] in ("match", "mismatch", "uncertain") and c["source"] == "vlm" for c in result["criteria"])
    assert scores == scores_fresh and all(0.0 < s < 1.0 for s in scores)


@pytest.mark.parametrize("model", DOOR_FAMILIES)
def test_cli_add_compare_generate_and_the_vlm_embedder(tmp_path, real_photo, capsys, model):
    store = tmp_path / "store"
    paths = []
    for name in ("chelsea", "coffee"):
        path = tmp_path / f"{name}.png"
        real_photo(name, size=(64, 48)).save(path)
        paths.append(str(path))
    assert main(["add", *paths, "--store", str(store), "--model", model, "--attributes", "none", "--json"]) == 0
    capsys.readouterr()
    assert main(["compare", paths[0], "--ref", "chelsea", "--ref", "coffee", "--criteria", "short fur", "--no-attributes", "--store", str(store),
                 "--model", model, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["random_weights"] is True and out["results"]
    assert main(["generate", "--ref", "coffee", "--model", model, "--image", paths[1], "--prompt", "Describe", "--max-new-tokens", "4",
                 "--store", str(store), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["random_weights"] is True
    embedder = f"vlm:{model}"
    assert main(["search", "a cat", "--k", "2", "--embedder", embedder, "--store", str(store), "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["embedder"] == embedder and {r["ref_id"] for r in found["results"]} == {"chelsea", "coffee"}


@pytest.mark.parametrize("model", DOOR_FAMILIES)
def test_server_add_compare_and_sdk_chat_by_reference(make_server, model):
    live = make_server(model=model)
    reference, candidate = photo_png("chelsea", (56, 56)), photo_png("coffee", (56, 56))
    with live.client() as c:
        assert c.post("/v1/references", json={"image": b64(reference), "id": "cat"}).status_code == 201
        compared = c.post("/v1/compare", json={"candidate": b64(candidate), "criteria": RUBRIC, "ref_ids": ["cat"]})
        assert compared.status_code == 200, compared.text
        assert compared.json()["results"][0]["reference_cached"] is True
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="none", max_retries=0, timeout=120)
    reply = client.chat.completions.create(model=model, max_tokens=6, messages=[{"role": "user", "content": [
        {"type": "text", "text": "Reference:"}, {"type": "image_url", "image_url": {"url": "refsight://ref/cat"}},
        {"type": "text", "text": "Candidate:"}, {"type": "image_url", "image_url": {"url": data_url(candidate)}},
        {"type": "text", "text": "Same animal?"}]}])
    # The reference from its stored package; the candidate's package was kept when the compare encoded it.
    assert reply.model_extra["refsight"]["references_cached"] == [True, True]
    assert reply.usage.completion_tokens >= 1 and reply.model_extra["refsight"]["random_weights"] is True
