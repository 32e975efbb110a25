"""The EfficientNet-Lite0 definition loads the shipped weights and classifies real photos."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from refsight.errors import InvalidInputError, ModelLoadError
from refsight.embedders.efficientnet_lite import (
    EfficientNetLite0,
    EfficientNetLite0Classifier,
    Preprocessing,
    imagenet_labels,
    load_efficientnet_lite0,
    weights_path,
)
from refsight.samples import load_sample

CAT_LABELS = {"tabby", "tiger cat", "Egyptian cat"}
COFFEE_LABELS = {"cup", "espresso", "coffee mug"}
ROCKET_LABELS = {"missile", "projectile", "space shuttle"}


@pytest.fixture(scope="module")
def clf() -> EfficientNetLite0Classifier:
    return load_efficientnet_lite0()


@pytest.fixture(scope="module")
def photos() -> dict[str, Image.Image]:
    return {n: load_sample(n) for n in ("chelsea", "coffee", "rocket")}


def test_state_dict_keys_match_weights_file_exactly():
    import torch

    state = torch.load(weights_path(), map_location="cpu", weights_only=True)
    net_state = EfficientNetLite0().state_dict()
    assert set(net_state) == set(state)
    assert all(net_state[k].shape == v.shape for k, v in state.items())


def test_loader_is_cached_per_process(clf):
    assert load_efficientnet_lite0() is clf


def test_labels_are_the_1000_imagenet_classes(clf):
    labels = imagenet_labels()
    assert len(labels) == 1000 and clf.labels == labels
    assert labels[281] == "tabby" and labels[967] == "espresso" and labels[657] == "missile"


@pytest.mark.slow  # classifies real photos
@pytest.mark.parametrize(
    "name,expected", [("chelsea", CAT_LABELS), ("coffee", COFFEE_LABELS), ("rocket", ROCKET_LABELS)]
)
def test_real_photo_top5_has_the_right_label(clf, photos, name, expected):
    top = clf.top_k([photos[name]], k=5)[0]
    assert len(top) == 5
    assert expected & {label for label, _ in top}, top
    assert top[0][0] in expected  # not just somewhere in the top 5: first


def test_probabilities_sum_to_one_and_topk_is_sorted(clf, photos):
    probs = clf.probabilities(list(photos.values()))
    assert probs.shape == (3, 1000) and probs.dtype == np.float32
    np.testing.assert_allclose(probs.sum(1), 1.0, atol=1e-4)
    scores = [p for _, p in clf.top_k([photos["coffee"]], k=10)[0]]
    assert scores == sorted(scores, reverse=True)


def test_features_are_unit_1280_vectors_and_separate_photos(clf, photos):
    feats = clf.features(list(photos.values()))
    assert feats.shape == (3, 1280) and feats.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(feats, axis=1), 1.0, atol=1e-5)
    flipped = clf.features([photos["chelsea"].transpose(Image.Transpose.FLIP_LEFT_RIGHT)])[0]
    # a mirrored cat is nearer the cat than the coffee or the rocket
    sims = feats @ flipped
    assert sims[0] > sims[1] and sims[0] > sims[2]


@pytest.mark.slow  # classifies every photo twice
def test_batching_does_not_change_results(clf, photos):
    batch = clf.probabilities(list(photos.values()))
    single = np.concatenate([clf.probabilities([p]) for p in photos.values()])
    np.testing.assert_allclose(batch, single, atol=1e-5)


@pytest.mark.slow  # classifies every photo twice
def test_tf_lite_preprocessing_beats_imagenet_mean_std(clf, photos):
    """The weights were converted from TF Lite: (x-127)/128 is the scaling they expect."""
    imagenet = EfficientNetLite0Classifier(
        preprocessing=Preprocessing(mean=(123.675, 116.28, 103.53), std=(58.395, 57.12, 57.375))
    )
    labels = np.array(clf.labels)
    wanted = {"chelsea": CAT_LABELS, "coffee": COFFEE_LABELS, "rocket": ROCKET_LABELS}
    imgs = [photos[n] for n in wanted]
    mass_tf = [clf.probabilities(imgs)[i][np.isin(labels, list(w))].sum() for i, w in enumerate(wanted.values())]
    mass_in = [imagenet.probabilities(imgs)[i][np.isin(labels, list(w))].sum() for i, w in enumerate(wanted.values())]
    assert all(a > b for a, b in zip(mass_tf, mass_in)), (mass_tf, mass_in)


def test_fingerprint_names_weights_and_preprocessing(clf):
    fp = clf.fingerprint
    assert fp["model"] == "efficientnet-lite0/imagenet-1k"
    assert len(fp["weights_sha256"]) == 64
    assert fp["preprocessing"]["crop"] == 224 and fp["preprocessing"]["mean"] == [127.0] * 3


def test_bad_inputs_raise_typed_errors(clf, photos):
    with pytest.raises(InvalidInputError, match="images"):
        clf.probabilities(photos["coffee"])  # a single image, not a list
    with pytest.raises(InvalidInputError, match=r"images\[1\]"):
        clf.probabilities([photos["coffee"], "not an image"])
    with pytest.raises(InvalidInputError, match="k"):
        clf.top_k([photos["coffee"]], k=0)
    assert clf.features([]).shape == (0, 1280)


def test_wrong_weights_file_is_a_model_load_error(tmp_path):
    import torch

    bad = tmp_path / "bad.pth"
    torch.save({"_fc.weight": torch.zeros(3, 3)}, bad)
    with pytest.raises(ModelLoadError, match="do not match"):
        EfficientNetLite0Classifier(bad)
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelLoadError, match="cannot read"):
        EfficientNetLite0Classifier(tmp_path / "junk.pth")
