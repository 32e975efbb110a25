"""How a chat prompt ends (issue 51): the one check of ``prompt_end``, the final turn a continued prompt writes
after the answer's opening, vLLM's body, and what a backend that cannot render or report refuses by name.

The rendering itself is proven on real models over HTTP (tests/server/prefill_checks.py: transformers, llama.cpp,
and against llama-server itself).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from refsight import GenerationRequest, Engine, InvalidInputError
from refsight.backends.turns import check_prompt_form, split_final_turn
from refsight.requests import PROMPT_ENDS
from refsight.backends.vllm.messages import chat_body

TURNS = [("system", 1), ("user", 2), ("assistant", 1)]
SEGMENTS = ["Be brief.", "Name a colour", ".", "The colour is"]
RENDERS_ALL = SimpleNamespace(name="all", supports_raw_prompt=True, prompt_ends=frozenset(PROMPT_ENDS))


def _refused(request: GenerationRequest, backend=RENDERS_ALL) -> str:
    with pytest.raises(InvalidInputError) as e:
        check_prompt_form(backend, 0, request)
    assert e.value.input == "prompt_end"
    return str(e.value)


def test_a_continued_prompt_is_the_earlier_turns_then_the_final_turns_text():
    assert split_final_turn(SEGMENTS, TURNS) == (SEGMENTS[:3], TURNS[:2], "The colour is")
    assert split_final_turn(["a", "b", "c"], [("user", 1), ("assistant", 2)]) == (["a"], [("user", 1)], "bc")
    for end in PROMPT_ENDS:
        check_prompt_form(RENDERS_ALL, 0, GenerationRequest(list(SEGMENTS), turns=TURNS, prompt_end=end))


def test_what_a_prompt_cannot_end_with_is_refused_by_name():
    assert "final assistant turn" in _refused(GenerationRequest(["hi"], prompt_end="continue"))
    assert "final assistant turn" in _refused(GenerationRequest(["a", "b"], turns=[("assistant", 1), ("user", 1)],
                                                                prompt_end="continue"))
    image = SimpleNamespace()  # any segment that is not text
    assert "text only" in _refused(GenerationRequest(["a", image], turns=[("user", 1), ("assistant", 1)],
                                                     prompt_end="continue"))
    plain = SimpleNamespace(name="plain", supports_raw_prompt=True, prompt_ends=frozenset({"generation_prompt"}))
    assert "plain cannot" in _refused(GenerationRequest(list(SEGMENTS), turns=TURNS, prompt_end="continue"), plain)
    # What no backend could render, the request refuses when it is built.
    with pytest.raises(InvalidInputError, match="one of") as e:
        GenerationRequest(["a"], prompt_end="later")
    assert e.value.input == "prompt_end"
    for end in ("continue", "none"):
        with pytest.raises(InvalidInputError, match="raw prompt") as e:
            GenerationRequest(["a"], raw_prompt=True, prompt_end=end)
        assert e.value.input == "prompt_end"


def test_vllm_gets_its_own_fields_for_the_prompts_end():
    def body(end: str) -> dict:
        return chat_body("m", list(SEGMENTS), GenerationRequest(list(SEGMENTS), turns=TURNS, prompt_end=end), dict)

    assert "add_generation_prompt" not in body("generation_prompt") and "continue_final_message" not in body("generation_prompt")
    assert (body("continue")["add_generation_prompt"], body("continue")["continue_final_message"]) == (False, True)
    assert (body("none")["add_generation_prompt"], body("none")["continue_final_message"]) == (False, False)
    assert body("continue")["messages"][-1] == {"role": "assistant", "content": "The colour is"}


def test_a_backend_that_cannot_render_or_report_refuses_by_name(tmp_path):
    with Engine(tmp_path / "store", model="toy") as engine:
        with pytest.raises(InvalidInputError) as e:
            engine.chat(["hi", "Hello"], turns=[("user", 1), ("assistant", 1)], prompt_end="continue")
        assert e.value.input == "prompt_end"
        with pytest.raises(InvalidInputError) as e:
            engine.chat(["hi"], on_text=print, on_prompt=lambda *figures: None)
        assert e.value.input == "on_prompt"
