"""The generation fields refsight knows but does not use as given, as data: the hints, and the fields taken only
at their neutral value (the fields refsight honours are :class:`~.generation_body.GenerationBody`'s own).

The names are OpenAI's, vLLM's, llama-server's and Ollama's: every text route reads every one of them (Open
WebUI's OpenAI connection sends Ollama's settings at the top level of a ``/v1`` body; an Ollama body's ``options``
are read as these fields). Each has its type, so a string sent for a number is refused here too
(:mod:`.dialect_body`'s strict types).

- :data:`HINTS`: the value cannot change the answer (a cache, a slot, the runtime's resources, a setting read
  only by a sampler that is off, scheduling): accepted, and named in the reply's ``refsight.ignored``.
- :data:`NEUTRAL`: the value would change the answer, and refsight does not do what it asks (a sampler it does
  not have, a reply it does not give): accepted at the values that change nothing, any other a 400 naming the
  field and the reason.

A field in neither, and not one the body declares, is unknown: accepted and named as ignored (its value is not
read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import Field, create_model

from .dialect_body import DialectBody

__all__ = ["HINTS", "NEUTRAL", "Neutral", "GenerationFields"]

#: Fields whose value cannot change the answer, by name, with the type each dialect gives it.
HINTS: dict[str, Any] = {
    # llama-server: its slot and prompt cache, timeouts and transport, context shifting (refsight never shifts:
    # a prompt over the context is refused), and the settings of samplers that are off here.
    "cache_prompt": bool, "id_slot": int, "n_cache_reuse": int, "t_max_prompt_ms": int, "sse_ping_interval": float,
    "backend_sampling": bool, "n_keep": int, "n_discard": int, "dry_base": float, "dry_allowed_length": int,
    "dry_penalty_last_n": int, "dry_sequence_breakers": list[str], "xtc_threshold": float, "dynatemp_exponent": float,
    "mirostat_tau": float, "mirostat_eta": float,
    # OpenAI's and vLLM's bookkeeping, scheduling and caching.
    "user": str, "store": bool, "metadata": dict[str, Any], "service_tier": str, "prompt_cache_key": str,
    "safety_identifier": str, "prediction": dict[str, Any], "request_id": str, "priority": int, "cache_salt": str,
    # Ollama's runtime settings (its options; Open WebUI's OpenAI connection sends them at the top level): the
    # context is fixed when the server starts (-c), the model stays loaded, resources are the server's.
    "num_ctx": Annotated[int, Field(ge=1)], "keep_alive": float | str, "num_keep": int, "num_batch": int, "num_thread": int, "num_gpu": int,
    "main_gpu": int, "use_mmap": bool, "use_mlock": bool, "numa": bool, "low_vram": bool, "f16_kv": bool,
    "logits_all": bool, "vocab_only": bool, "penalize_newline": bool,
}


@dataclass(frozen=True)
class Neutral:
    """A known field refsight does not honour: taken at ``values`` (which change nothing), else refused: ``reason``."""

    type: Any
    values: tuple[Any, ...]
    reason: str = ""

    def refusal(self, name: str) -> str:
        """The 400's message for another value of ``name``."""
        taken = " or ".join(repr(v) for v in self.values)
        if not self.reason:
            return f"{name}: only {taken} (no effect) is supported"
        return f"{name}: {self.reason}" + (f" (only {taken} is taken)" if taken else "")


_SCHEMA = "use response_format (a JSON schema) or grammar"
_TEMPLATE = "a raw prompt has no chat template to end"

#: Fields that would change the answer where refsight does not do what they ask, taken only at a neutral value.
NEUTRAL: dict[str, Neutral] = {
    # Samplers refsight does not have (llama-server's, Ollama's), each at its "off" value.
    "typical_p": Neutral(float, (1.0,), "locally typical sampling is not supported"),
    "tfs_z": Neutral(float, (1.0,), "tail-free sampling is not supported"),
    "mirostat": Neutral(int, (0,), "mirostat sampling is not supported"),
    "dry_multiplier": Neutral(float, (0.0,), "DRY sampling is not supported"),
    "xtc_probability": Neutral(float, (0.0,), "XTC sampling is not supported"),
    "dynatemp_range": Neutral(float, (0.0,), "dynamic temperature is not supported"),
    "top_n_sigma": Neutral(float, (-1.0,), "top-n-sigma sampling is not supported"),
    "min_keep": Neutral(int, (0, 1), "the samplers keep at least one token, no more"),
    "samplers": Neutral(list[str] | str, (), "the sampler order is fixed (penalties, top_k, top_p, min_p, temperature)"),
    "n_indent": Neutral(int, (0,), "an indentation limit is not supported"),
    "t_max_predict_ms": Neutral(int, (0,), "a time limit on generation is not supported"),
    "lora": Neutral(list[Any], ([],), "LoRA adapters are not supported"),
    "n_cmpl": Neutral(int, (1,), "one answer per prompt is generated"),
    "reasoning_format": Neutral(str, ("none",), "the answer is the text as generated: reasoning is not split out"),
    "grammar_lazy": Neutral(bool, (False,), "lazy grammars are not supported"),
    "grammar_triggers": Neutral(list[Any], ([],), "lazy grammars are not supported"),
    "preserved_tokens": Neutral(list[Any], ([],), "lazy grammars are not supported"),
    # vLLM's and OpenAI's, at their defaults.
    "min_tokens": Neutral(int, (0,), "a minimum answer length is not supported"),
    "skip_special_tokens": Neutral(bool, (True,), "special tokens are never written into the answer"),
    "spaces_between_special_tokens": Neutral(bool, (True,)),
    "include_stop_str_in_output": Neutral(bool, (False,), "a stop string is never part of the answer"),
    "echo": Neutral(bool, (False,), "the prompt is never repeated in the answer"),
    "best_of": Neutral(int, (1,), "one answer is generated"),
    "use_beam_search": Neutral(bool, (False,), "beam search is not supported"),
    "length_penalty": Neutral(float, (1.0,), "beam search is not supported"),
    "suffix": Neutral(str, ("",), "fill-in-the-middle is not supported"),
    "stop_token_ids": Neutral(list[int], ([],), "stop tokens by id are not supported; send stop strings"),
    "bad_words": Neutral(list[str], ([],), "banned words are not supported"),
    "allowed_token_ids": Neutral(list[int], (), "an allow-list of tokens is not supported"),
    "prompt_logprobs": Neutral(int, (), "the prompt's log probabilities are not returned"),
    "truncate_prompt_tokens": Neutral(int, (), "a prompt is never truncated (one over the limit is refused)"),
    "guided_json": Neutral(dict[str, Any] | str, (), _SCHEMA),
    "guided_regex": Neutral(str, (), _SCHEMA),
    "guided_choice": Neutral(list[str], (), _SCHEMA),
    "guided_grammar": Neutral(str, (), _SCHEMA),
    "structured_outputs": Neutral(dict[str, Any], (), _SCHEMA),
    "modalities": Neutral(list[str], (["text"],), "the answer is text only"),
    "audio": Neutral(dict[str, Any], (), "audio answers are not supported"),
    "web_search_options": Neutral(dict[str, Any], (), "web search is not supported"),
    "verbosity": Neutral(str, (), "answer verbosity is not supported"),
    # Tool calling where no chat is rendered (the chat body honours tools; functions are OpenAI's retired form).
    "tools": Neutral(list[Any], ([],)),
    "tool_choice": Neutral(str | dict[str, Any], ("none",)),
    "parallel_tool_calls": Neutral(bool, (False,)),
    "functions": Neutral(list[Any], ([],)),
    "function_call": Neutral(str | dict[str, Any], ("none",)),
    # How a chat's prompt ends: a raw prompt's only at the values that change nothing (the chat body honours them).
    "add_generation_prompt": Neutral(bool, (True,), _TEMPLATE),
    "continue_final_message": Neutral(bool, (False,), _TEMPLATE),
}

#: The fields of both tables, typed (null: not sent), as the base of the generation bodies.
GenerationFields = create_model(  # type: ignore[call-overload]
    "GenerationFields", __base__=DialectBody, __module__=__name__,
    **{name: (kind | None, None) for name, kind in HINTS.items()},
    **{name: (rule.type | None, None) for name, rule in NEUTRAL.items()},
)
GenerationFields.__doc__ = "The fields of :data:`HINTS` and :data:`NEUTRAL`, each of its type (null: not sent)."
