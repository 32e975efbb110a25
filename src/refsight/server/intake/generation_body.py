"""The generation fields every text route shares (OpenAI chat and completions, llama-server's ``/completion``).

One rule for all of them: a field is **honoured** (it changes the answer exactly as its
runtime documents), **accepted as a hint** (it cannot change the answer: ``cache_prompt``,
``id_slot`` ...), **accepted at its no-op value** (``typical_p: 1.0``, ``n_probs: 0`` ...;
any other value is a 400 naming it), or **refused** with a 400 naming it. Nothing is
silently ignored. The names are OpenAI's, vLLM's and llama-server's: ``n_predict`` is
``max_tokens``; ``repeat_penalty`` is ``repetition_penalty``; vLLM's ``top_k: -1`` is
``top_k: 0`` (no limit); llama-server's top-level ``json_schema`` is a ``response_format``
JSON schema. llama-server's token constraints (``logit_bias``, ``ignore_eos``, a GBNF
``grammar``) are :class:`Sampling` fields: honoured where the backend lists them (llama.cpp),
a 400 naming the field elsewhere. ``return_progress`` (with ``stream``) sends llama-server's
``prompt_progress`` events where the backend reports its prompt's evaluation (llama.cpp,
transformers), a 400 naming it elsewhere. The chat's ``add_generation_prompt`` and
``continue_final_message`` are the chat body's (:mod:`..routes.openai`); on a raw prompt they have
no template to act on, so only their no-op values are taken there. :func:`check_generation` is the
one check every dialect's text route makes of a body against the served model (OpenAI's, vLLM's,
llama-server's, Ollama's and Anthropic's).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Literal, Mapping

from pydantic import BaseModel, ConfigDict, Field

from ... import InvalidInputError, Sampling
from ...requests import SAMPLING_RANGES, check_json_schema
from .bodies import IntegerOrNull, NumberOrNull
from ..edge.http_errors import ApiError
from .token_fields import logit_bias_pairs

__all__ = [
    "GenerationBody", "check_generation", "ResponseFormat", "HINT_FIELDS", "NO_OP_VALUES", "REFUSED_FIELDS", "DEFAULT_MAX_TOKENS",
    "check_schema",
]

#: ``max_tokens`` when a request names none (OpenAI's chat default is "the rest of the context").
DEFAULT_MAX_TOKENS = 128
#: Fields accepted whatever their value: they cannot change the answer.
HINT_FIELDS = frozenset({"user", "cache_prompt", "id_slot", "return_tokens", "timings_per_token"})
#: Fields accepted at the value that changes nothing (their default in llama-server or vLLM); any other is a 400.
NO_OP_VALUES: dict[str, Any] = {
    "min_tokens": 0, "skip_special_tokens": True,
    "include_stop_str_in_output": False, "spaces_between_special_tokens": True, "echo": False,
    "add_generation_prompt": True, "continue_final_message": False, "typical_p": 1.0, "tfs_z": 1.0,
    "mirostat": 0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "n_keep": 0,
    "best_of": 1, "suffix": None, "tools": [], "tool_choice": "none", "parallel_tool_calls": False,
    "repeat_last_n": -1,  # the whole context: what repetition_penalty counts here
    "t_max_predict_ms": 0,
}
#: Fields refused by name with the reason (what is not supported, and what to send instead).
REFUSED_FIELDS: dict[str, str] = {
    "lora": "LoRA adapters are not supported",
}


def _declared(name: str, description: str | None = None) -> Any:
    """A sampling field whose range the schema declares (:class:`Sampling`'s own numbers) and Sampling checks."""
    low, high, open_low = SAMPLING_RANGES[name]
    bounds = {"exclusiveMinimum" if open_low else "minimum": low, "maximum": high}
    return Field(None, description=description, json_schema_extra=bounds)


def _no_op(expected: Any, value: Any) -> bool:
    """Whether ``value`` is the no-op ``expected`` (None: not set; an empty list or object: either empty).

    ``true``/``false`` are no number here (``typical_p: true`` is not 1.0), nor a number a boolean."""
    if value is None:
        return True
    if isinstance(value, bool) != isinstance(expected, bool):
        return False
    if value == expected:
        return True
    return expected in ({}, []) and value in ({}, [])


class JSONSchemaFormat(BaseModel):
    """The ``json_schema`` member of ``response_format``."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`` (llama-server: ``json_object`` with ``schema``)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class GenerationBody(BaseModel):
    """Sampling, the token bound and the JSON constraint, in every spelling the clients send."""

    model_config = ConfigDict(extra="allow")
    max_tokens: IntegerOrNull = Field(None, ge=1)
    n_predict: IntegerOrNull = Field(None, ge=-1, description="llama-server's max_tokens (-1: up to the server's limit)")
    # The sampling fields' ranges are declared for the schema, and checked by Sampling alone (one check).
    temperature: NumberOrNull = _declared("temperature")
    top_p: NumberOrNull = _declared("top_p")
    top_k: IntegerOrNull = Field(
        None, description="keep the k most likely tokens (0 or -1: no limit)", json_schema_extra={"minimum": -1}
    )
    min_p: NumberOrNull = _declared("min_p")
    repetition_penalty: NumberOrNull = _declared("repetition_penalty")
    repeat_penalty: NumberOrNull = _declared("repetition_penalty", "llama.cpp's name of repetition_penalty")
    seed: IntegerOrNull = Field(
        None, description="-1 (llama-server): a fresh seed", json_schema_extra={"minimum": -1, "exclusiveMaximum": 2**63}
    )
    stop: str | list[str] | None = None
    frequency_penalty: NumberOrNull = _declared("frequency_penalty")
    presence_penalty: NumberOrNull = _declared("presence_penalty")
    response_format: ResponseFormat | None = None
    json_schema: dict[str, Any] | None = Field(None, description="llama-server: constrain the answer to this schema")
    grammar: str | None = Field(None, description="llama-server: a GBNF grammar the answer follows (not with a schema)")
    logit_bias: dict[str, float | bool] | list[list[Any]] | None = Field(
        None, description="token id (or text) to a bias added to its logit; false bans it (llama-server's forms)"
    )
    ignore_eos: bool | None = Field(None, description="llama-server: never end at an end-of-generation token")
    n_probs: IntegerOrNull = Field(
        None, ge=0, description="llama-server: each token's log probability and its N most likely alternatives (0: none)"
    )
    post_sampling_probs: bool | None = Field(
        None, description="llama-server: with n_probs, the sampler chain's probabilities (prob, top_probs) over the tokens it kept"
    )
    return_progress: bool | None = Field(
        None, description="llama-server: with stream, prompt_progress events (total, cache, processed, time_ms) before the answer"
    )

    def requested_logprobs(self) -> tuple[int | None, str]:
        """``Sampling.logprobs`` of the request (None: none asked) and the field that asked (a 400 names it)."""
        return (self.n_probs or None), "n_probs"

    def check_fields(self) -> None:
        """400 naming the first field that is refused, or set away from its no-op value, or unknown."""
        for name, value in sorted((self.model_extra or {}).items()):
            if name in HINT_FIELDS:
                continue
            if name in REFUSED_FIELDS:
                raise ApiError(400, "unsupported", f"{name}: {REFUSED_FIELDS[name]}", param=name)
            if name in NO_OP_VALUES:
                if not _no_op(NO_OP_VALUES[name], value):
                    raise ApiError(
                        400, "unsupported", f"{name}: only {NO_OP_VALUES[name]!r} (no effect) is supported", param=name
                    )
                continue
            raise ApiError(400, "unsupported", f"{name}: this field is not supported by refsight", param=name)
        if self.repetition_penalty is not None and self.repeat_penalty is not None and (
            self.repetition_penalty != self.repeat_penalty
        ):
            raise ApiError(
                400, "invalid_input", "repeat_penalty: differs from repetition_penalty; give one", param="repeat_penalty"
            )

    def token_limit(
        self, limit: int, given: int | None = None, name: str = "max_tokens", default: int = DEFAULT_MAX_TOKENS
    ) -> int:
        """The answer's token bound: ``given`` (or ``max_tokens``), else ``n_predict``, else ``default``
        (the server's ``--n-predict``; -1: ``limit``)."""
        given = self.max_tokens if given is None else given
        if given is not None and self.n_predict is not None and self.n_predict != given:
            raise ApiError(400, "invalid_input", f"n_predict: differs from {name}; give one", param="n_predict")
        if self.n_predict == 0:
            raise ApiError(400, "unsupported", "n_predict: 0 (evaluate the prompt only) is not supported", param="n_predict")
        wanted = given or (limit if self.n_predict == -1 else self.n_predict) or (limit if default == -1 else default)
        if wanted > limit:
            param = name if given is not None else "n_predict"
            raise ApiError(400, "invalid_input", f"{param}: {wanted} is over the limit of {limit}", param=param)
        return wanted

    def sampling(
        self, defaults: Mapping[str, Any] | None = None, tokenize: Callable[[str], list[int]] | None = None
    ) -> Sampling:
        """The request's :class:`Sampling` (greedy unless it says otherwise); 400 naming a bad value.

        ``defaults``: Sampling fields the served model sets (an Ollama model's params layer), used
        for each field the request leaves unset (:meth:`Sampling.merged`, the one merge and check).
        ``tokenize``: the served model's tokens of a text, for ``logit_bias`` keys given as text.
        """
        penalty = self.repetition_penalty if self.repetition_penalty is not None else self.repeat_penalty
        given = {
            "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed, "top_k": self.top_k,
            "stop": self.stop, "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
            "min_p": self.min_p, "repetition_penalty": penalty, "ignore_eos": self.ignore_eos, "grammar": self.grammar or None,
        }
        if self.grammar and self.schema() is not None:
            raise ApiError(400, "invalid_input", "grammar: give a GBNF grammar or a JSON schema, not both", param="grammar")
        if self.logit_bias is not None:
            given["logit_bias"] = logit_bias_pairs(self.logit_bias, tokenize or _no_text_keys)
        given["logprobs"], logprobs_field = self.requested_logprobs()
        given["post_sampling_probs"] = self.post_sampling_probs
        try:
            return Sampling.merged(given, defaults)
        except InvalidInputError as e:
            if e.input == "logprobs":
                raise ApiError(400, "invalid_input", f"{logprobs_field}: {e.reason}", param=logprobs_field) from None
            raise ApiError(400, "invalid_input", str(e), param=str(e.input)) from None

    def schema(self) -> dict[str, Any] | None:
        """The JSON schema the answer must follow (``response_format`` or ``json_schema``), checked; None: free text."""
        fmt = self.response_format
        if self.json_schema is not None:
            if fmt is not None and fmt.type != "text":
                raise ApiError(400, "invalid_input", "json_schema: give it or response_format, not both", param="json_schema")
            return check_schema(self.json_schema, "json_schema")
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return {"type": "object"} if fmt.schema_ is None else check_schema(fmt.schema_, "response_format.schema")
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ApiError(
                400, "invalid_input", "response_format.json_schema.schema: a json_schema format needs a schema",
                param="response_format",
            )
        return check_schema(fmt.json_schema.schema_, "response_format.json_schema.schema")


def _no_text_keys(text: str) -> list[int]:
    raise ApiError(400, "unsupported", f"logit_bias: text keys ({text[:40]!r}) need the served model's tokenizer",
                   param="logit_bias")


def check_schema(schema: dict[str, Any], where: str) -> dict[str, Any]:
    """``schema`` when it is a valid JSON Schema (checked against its meta-schema), else a 400 naming the problem."""
    from jsonschema import Draft7Validator, SchemaError
    from jsonschema.validators import validator_for

    try:  # first the bounded check every grammar compiler needs (values, patterns, size): the meta-schema
        # check after it costs time by the value and compiles every pattern (300,000 properties: 4 minutes)
        check_json_schema(schema, where)
    except InvalidInputError as e:
        raise ApiError(400, "invalid_input", str(e), param=where.partition(".")[0]) from None
    try:
        try:
            validator_for(schema).check_schema(schema)
        except SchemaError:
            if "$schema" in schema:
                raise
            # No declared draft: the latest is tried first, then draft-07, whose tuple form
            # ("items": [...]) llama-server and the grammar compilers take too.
            Draft7Validator.check_schema(schema)
    except SchemaError as e:
        path = "/".join(str(p) for p in e.absolute_path) or "(root)"
        param = "json_schema" if where == "json_schema" else "response_format"
        raise ApiError(
            400, "invalid_input", f"{where}: not a valid JSON Schema at {path}: {e.message[:300]}", param=param
        ) from None
    return schema


def check_generation(body: GenerationBody, service: Any, given: int | None, max_limit: int) -> tuple[int, Sampling]:
    """The checks every text route makes: fields, the model, the token bound, the sampling the backend honours
    and ``return_progress`` where it reports its prompt's evaluation.

    ``given``: the chat's ``max_completion_tokens`` (checked before ``max_tokens``), None elsewhere.
    """
    body.check_fields()
    support = service.generation_support()
    if body.return_progress and getattr(body, "stream", None) and not support.prompt_progress:
        raise ApiError(400, "unsupported", f"return_progress: the served backend ({service.model}) does not report "
                       "its prompt's evaluation", param="return_progress")
    model = getattr(body, "model", None)
    # One server serves one model: clients written for OpenAI send "gpt-3.5-turbo" and read the reply's
    # `model`; only --strict-model-name makes another name a 404 (GET /v1/models/{id} is a lookup: always strict).
    if model is not None and model not in service.model_names and service.config.strict_model_names:
        raise ApiError(
            404, "model_not_found", f"model {model!r} is not served here; this server serves {service.served_model!r}",
            param="model",
        )
    default = service.config.n_predict
    max_new_tokens = body.token_limit(max_limit, given, "max_completion_tokens", default) if given is not None else (
        body.token_limit(max_limit, default=default)
    )
    tokenize = partial(service.tokenize, add_special=False, parse_special=False)  # llama-server's text keys
    sampling = body.sampling(service.sampling_defaults, tokenize)
    refused = sampling.unsupported(support.sampling_fields)
    if refused:
        # Named as the client spelled it (llama-server's n_probs, OpenAI's logprobs).
        param = body.requested_logprobs()[1] if refused[0] == "logprobs" else refused[0]
        raise ApiError(400, "unsupported", f"{param}: the served backend ({service.model}) does not support it", param=param)
    return max_new_tokens, sampling
