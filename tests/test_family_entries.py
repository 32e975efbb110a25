"""The family entries (``refsight.families``): one per model type, and every name an entry gives is found where
the builders and runtimes look it up (the recipe, the built-ins, the facts' values)."""

from __future__ import annotations

from refsight.families import FAMILIES, family
from refsight.families.entry import RUNTIMES, Traits


def test_each_model_type_has_one_entry_under_its_own_name():
    from refsight.families.kin import KIN, LEFT_OUT, TORCHVISION_ONLY
    from refsight.families.primary import PRIMARY

    entries = (*PRIMARY, *KIN, *TORCHVISION_ONLY, *LEFT_OUT)
    assert len(FAMILIES) == len(entries), "a model type entered twice"
    assert all(FAMILIES[model_type].model_type == model_type for model_type in FAMILIES)


def test_a_model_type_without_an_entry_gets_the_defaults():
    unknown = family("no_such_model_type")
    assert unknown.transformers.traits == Traits() and not any(unknown.on(r).proven for r in RUNTIMES)


def test_every_recipe_an_entry_names_builds_that_model_type_under_that_built_in():
    from refsight.builtin_models.family_checkpoints import FAMILY_SPECS, FamilySpec, family_recipe

    named = {f.transformers.builtin: f for f in FAMILIES.values() if f.transformers.recipe}
    assert set(named) == set(FAMILY_SPECS)
    for builtin, entry in named.items():
        spec = FamilySpec(**family_recipe(entry.transformers.recipe))
        assert (spec.model_type, spec.builtin_name) == (entry.model_type, builtin)


def test_a_cell_is_proven_or_left_out_never_both():
    for f in FAMILIES.values():
        for runtime in RUNTIMES:
            cell = f.on(runtime)
            assert not (cell.proven and cell.left_out), (f.model_type, runtime)
            assert bool(cell.builtin) == bool(cell.test), (f.model_type, runtime)


def test_the_runtime_facts_take_the_values_their_readers_know():
    assert {f.vllm.hub_layout for f in FAMILIES.values()} <= {"", "vision_model", "experts"}
    assert all(f.llamacpp.architecture for f in FAMILIES.values() if f.llamacpp.window_bound)
    assert all(f.vllm.proven for f in FAMILIES.values() if f.vllm.image_embeds or f.vllm.hub_layout)
