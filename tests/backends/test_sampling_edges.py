"""Every sampling value :class:`Sampling` accepts works on the transformers backends (issue 25, item 3).

A temperature so small that no float32 logits could tell it from argmax decodes greedily
(it used to divide the logits into inf/NaN: ``probability tensor contains inf/nan``); a
``top_p`` far below any token's probability keeps the most likely token (it used to keep
none: ``invalid multinomial distribution``). Values outside the declared ranges, or of the
wrong type, are refused as :class:`InvalidInputError` naming the parameter.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refsight.sampling import Sampling
from refsight.errors import InvalidInputError

#: Requests that must decode exactly as greedy decoding does.
GREEDY_EQUIVALENT = [
    Sampling(temperature=1e-300, seed=1),
    Sampling(temperature=1e-40, seed=2),
    Sampling(temperature=1e-12, seed=3),
    Sampling(temperature=2.0, top_p=1e-300, seed=4),
    Sampling(temperature=2.0, top_p=5e-324, seed=5),
]


@pytest.fixture(scope="module")
def backend(load):
    return load("tiny-qwen2-vl")


def _request(photos, sampling=None, max_new_tokens=6):
    from refsight.requests import GenerationRequest

    return GenerationRequest([photos["chelsea"], "Describe it."], max_new_tokens=max_new_tokens, sampling=sampling or Sampling())


def test_tiny_temperatures_and_top_p_decode_greedily(backend, photos):
    greedy = backend.generate([_request(photos)])[0].token_ids
    for sampling in GREEDY_EQUIVALENT:
        assert backend.generate([_request(photos, sampling)])[0].token_ids == greedy, sampling
    # in one batch too, beside a greedy row
    rows = backend.generate([_request(photos, s) for s in GREEDY_EQUIVALENT] + [_request(photos)])
    assert all(g.token_ids == greedy for g in rows)


def test_a_stream_at_a_tiny_temperature_is_the_greedy_stream(backend, photos):
    greedy = backend.generate([_request(photos)])[0]
    pieces: list[str] = []
    streamed = backend.generate_stream(_request(photos, Sampling(temperature=1e-300, seed=9)), on_text=pieces.append)
    assert streamed.token_ids == greedy.token_ids and "".join(pieces) == streamed.text == greedy.text


finite = dict(allow_nan=False, allow_infinity=False)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    temperature=st.floats(0.0, 2.0, **finite),
    top_p=st.floats(0.0, 1.0, exclude_min=True, **finite),
    penalties=st.tuples(st.floats(-2.0, 2.0, **finite), st.floats(-2.0, 2.0, **finite)),
    seed=st.integers(0, 2**63 - 1),
)
def test_every_accepted_value_generates(backend, photos, temperature, top_p, penalties, seed):
    sampling = Sampling(temperature=temperature, top_p=top_p, seed=seed, frequency_penalty=penalties[0], presence_penalty=penalties[1])
    generation = backend.generate([_request(photos, sampling, max_new_tokens=3)])[0]
    assert 1 <= len(generation.token_ids) <= 3


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"temperature": float("nan")}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"temperature": "0.5"}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": float("inf")}, "top_p"),
        ({"frequency_penalty": -2.1}, "frequency_penalty"),
        ({"presence_penalty": None}, "presence_penalty"),
        ({"seed": -1}, "seed"),
        ({"seed": 2**63}, "seed"),
        ({"seed": 1.5}, "seed"),
        ({"stop": "END"}, "stop"),
        ({"stop": ("x",) * 33}, "stop"),  # a request's own stop strings: at most 4 (test_a_request_sends_at_most_4_stops)
        ({"stop": ("",)}, "stop"),
    ],
)
def test_values_outside_the_declared_ranges_are_refused_by_name(fields, name):
    with pytest.raises(InvalidInputError) as info:
        Sampling(**fields)
    assert info.value.input == name


def test_a_request_sends_at_most_4_stops_while_a_models_defaults_may_hold_more():
    ten = tuple(f"<stop{i}>" for i in range(10))  # an Ollama Modelfile's PARAMETER stop lines
    assert Sampling.merged({}, {"stop": ten}).stop == ten and Sampling(stop=ten).stop == ten
    with pytest.raises(InvalidInputError) as info:
        Sampling.merged({"stop": ["a", "b", "c", "d", "e"]}, {"stop": ten})
    assert info.value.input == "stop" and "at most 4" in info.value.reason


def test_stop_strings_given_as_a_list_become_a_tuple():
    assert Sampling(stop=["END"]).stop == ("END",)
    assert hash(Sampling(stop=["END"])) == hash(Sampling(stop=("END",)))
