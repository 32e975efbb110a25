"""The generation fields every text route shares (OpenAI chat and completions, llama-server's ``/completion``,
Ollama's ``options``, Anthropic's fields as the chat route reads them).

The rule every dialect follows (:mod:`.dialect_body`): a field is **honoured** (it changes the answer exactly
as its runtime documents: the fields :class:`GenerationBody` declares), **a hint** (its value cannot change the
answer: :data:`~.generation_fields.HINTS`, named in the reply's ``refsight.ignored``), **taken at its neutral
value** (:data:`~.generation_fields.NEUTRAL`: ``typical_p: 1.0``, ``mirostat: 0`` ...; any other value is a 400
naming it and the reason), or **unknown** (accepted and named in ``refsight.ignored``). Every type is strict:
``"n_probs": "5"`` is refused, naming the field. The names are OpenAI's, vLLM's, llama-server's and Ollama's:
``n_predict`` is ``max_tokens`` (``-1``: up to the server's limit, on every route); ``repeat_penalty`` is
``repetition_penalty``, over the last ``repeat_last_n`` tokens (llama.cpp's and Ollama's window, honoured where
the backend lists it; 0: no penalty); vLLM's ``top_k: -1`` is ``top_k: 0`` (no limit); llama-server's top-level
``json_schema`` and Ollama's ``format`` (``"json"`` or a schema; Open WebUI sends it at the top level of a
``/v1`` body) are a ``response_format`` JSON schema. llama-server's token constraints (``logit_bias``,
``""`` being none, ``ignore_eos``, a GBNF ``grammar``) are :class:`Sampling` fields: honoured where the backend
lists them (llama.cpp), a 400 naming the field elsewhere. ``return_progress`` (with ``stream``) sends
llama-server's ``prompt_progress`` events where the backend reports its prompt's evaluation (llama.cpp,
transformers), a 400 naming it elsewhere. The chat template's variables (``chat_template_kwargs``,
``reasoning_effort``, ``think``) are read by the routes that render a chat (:mod:`.template_variables`); a raw
prompt has no template, so there they are hints. :func:`check_generation` is the one check every dialect's text
route makes of a body against the served model.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, ClassVar, Literal, Mapping

from pydantic import Field

from ... import InvalidInputError, Sampling
from ...requests import SAMPLING_RANGES, check_json_schema
from ..edge.http_errors import ApiError
from .dialect_body import DialectBody
from .generation_fields import HINTS, NEUTRAL, GenerationFields, Neutral
from .token_fields import logit_bias_pairs

__all__ = ["GenerationBody", "check_generation", "ResponseFormat", "DEFAULT_MAX_TOKENS", "check_schema",
           "TEMPLATE_FIELDS", "UNTIL_THE_LIMIT"]

#: ``max_tokens`` when a request names none (OpenAI's chat default is "the rest of the context").
DEFAULT_MAX_TOKENS = 128
#: ``max_tokens`` / ``n_predict`` of an answer as long as the server allows (llama-server's "until the end").
UNTIL_THE_LIMIT = -1
#: The fields that set a chat template's variables (:mod:`.template_variables`): hints where no template renders.
TEMPLATE_FIELDS = frozenset({"chat_template_kwargs", "reasoning_effort", "think"})


def _declared(name: str, description: str | None = None) -> Any:
    """A sampling field whose range the schema declares (:class:`Sampling`'s own numbers) and Sampling checks."""
    low, high, open_low = SAMPLING_RANGES[name]
    bounds = {"exclusiveMinimum" if open_low else "minimum": low, "maximum": high}
    return Field(None, description=description, json_schema_extra=bounds)


class JSONSchemaFormat(DialectBody):
    """The ``json_schema`` member of ``response_format``."""

    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class ResponseFormat(DialectBody):
    """``{"type": "text" | "json_object" | "json_schema", "json_schema": {...}}`` (llama-server: ``json_object`` with ``schema``)."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class GenerationBody(GenerationFields):
    """Sampling, the token bound and the JSON constraint, in every spelling the clients send."""

    #: Fields sent here whose value cannot change the answer (named in ``refsight.ignored``).
    hints: ClassVar[frozenset[str]] = frozenset({*HINTS, *TEMPLATE_FIELDS, "verbose", "return_tokens"})
    #: The known fields taken only at their neutral value, on this route.
    neutral: ClassVar[Mapping[str, Neutral]] = NEUTRAL

    max_tokens: int | None = Field(None, ge=UNTIL_THE_LIMIT, description="-1: up to the server's limit (llama-server)")
    n_predict: int | None = Field(None, ge=UNTIL_THE_LIMIT, description="llama-server's max_tokens (-1: up to the server's limit)")
    # The sampling fields' ranges are declared for the schema, and checked by Sampling alone (one check).
    temperature: float | None = _declared("temperature")
    top_p: float | None = _declared("top_p")
    top_k: int | None = Field(
        None, description="keep the k most likely tokens (0 or -1: no limit)", json_schema_extra={"minimum": -1}
    )
    min_p: float | None = _declared("min_p")
    repetition_penalty: float | None = _declared("repetition_penalty")
    repeat_penalty: float | None = _declared("repetition_penalty", "llama.cpp's name of repetition_penalty")
    repeat_last_n: int | None = Field(
        None, ge=-1, description="the repetition penalty's window in tokens (llama.cpp, Ollama; -1: all, 0: no penalty)"
    )
    seed: int | None = Field(
        None, description="-1 (llama-server): a fresh seed", json_schema_extra={"minimum": -1, "exclusiveMaximum": 2**63}
    )
    stop: str | list[str] | None = None
    frequency_penalty: float | None = _declared("frequency_penalty")
    presence_penalty: float | None = _declared("presence_penalty")
    response_format: ResponseFormat | None = None
    json_schema: dict[str, Any] | None = Field(None, description="llama-server: constrain the answer to this schema")
    format: Literal["", "json"] | dict[str, Any] | None = Field(
        None, description="Ollama's (Open WebUI sends it on /v1 too): \"json\" or a JSON schema the answer follows"
    )
    grammar: str | None = Field(None, description="llama-server: a GBNF grammar the answer follows (not with a schema)")
    logit_bias: dict[str, float | bool] | list[list[Any]] | Literal[""] | None = Field(
        None, description="token id (or text) to a bias added to its logit; false bans it (llama-server's forms; "
        "\"\": none)"
    )
    ignore_eos: bool | None = Field(None, description="llama-server: never end at an end-of-generation token")
    n_probs: int | None = Field(
        None, ge=0, description="llama-server: each token's log probability and its N most likely alternatives (0: none)"
    )
    post_sampling_probs: bool | None = Field(
        None, description="llama-server: with n_probs, the sampler chain's probabilities (prob, top_probs) over the tokens it kept"
    )
    return_progress: bool | None = Field(
        None, description="llama-server: with stream, prompt_progress events (total, cache, processed, time_ms) before the answer"
    )
    timings_per_token: bool | None = Field(None, description="llama-server: timings on every streamed piece")
    return_tokens: bool | None = Field(None, description="llama-server (/completion): the answer's token ids")
    verbose: bool | None = Field(None, description="llama-server (chat): add __verbose (the default: refsight serve -v)")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="the chat template's variables (vLLM, llama-server): each one the template reads is set"
    )
    reasoning_effort: str | None = Field(
        None, description="the template's reasoning_effort variable (\"none\": enable_thinking false), as llama-server"
    )
    think: bool | Literal["low", "medium", "high"] | None = Field(
        None, description="Ollama's (Open WebUI sends it on /v1 too): the template's enable_thinking (a level: and its "
        "reasoning_effort)"
    )

    def requested_logprobs(self) -> tuple[int | None, str]:
        """``Sampling.logprobs`` of the request (None: none asked) and the field that asked (a 400 names it)."""
        return (self.n_probs or None), "n_probs"

    def check_fields(self) -> None:
        """400 naming the first known field set away from the neutral value it is taken at, or two spellings of one
        field that differ."""
        for name, rule in self.neutral.items():
            value = getattr(self, name, None)
            if value is not None and value not in rule.values:
                raise ApiError(400, "unsupported", rule.refusal(name), param=name)
        if self.repetition_penalty is not None and self.repeat_penalty is not None and (
            self.repetition_penalty != self.repeat_penalty
        ):
            raise ApiError(
                400, "invalid_input", "repeat_penalty: differs from repetition_penalty; give one", param="repeat_penalty"
            )

    def until_the_limit(self) -> bool:
        """Whether the answer may run to the server's limit (``max_tokens`` or ``n_predict`` -1: llama-server's)."""
        return UNTIL_THE_LIMIT in (self.max_tokens, self.n_predict)

    def token_limit(
        self, limit: int, given: int | None = None, name: str = "max_tokens", default: int = DEFAULT_MAX_TOKENS
    ) -> int:
        """The answer's token bound: ``given`` (or ``max_tokens``), else ``n_predict``, else ``default``
        (the server's ``--n-predict``); -1 in any of them: ``limit``."""
        given = self.max_tokens if given is None else given
        if given is not None and self.n_predict is not None and self.n_predict != given:
            raise ApiError(400, "invalid_input", f"n_predict: differs from {name}; give one", param="n_predict")
        for param, value in ((name, given), ("n_predict", self.n_predict)):
            if value == 0:
                raise ApiError(400, "unsupported", f"{param}: 0 (evaluate the prompt only) is not supported", param=param)
        wanted = next((v for v in (given, self.n_predict, default) if v is not None))
        wanted = limit if wanted == UNTIL_THE_LIMIT else wanted
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
            "min_p": self.min_p, "repetition_penalty": penalty, "repeat_last_n": self.repeat_last_n,
            "ignore_eos": self.ignore_eos, "grammar": self.grammar or None,
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
        """The JSON schema the answer must follow (``response_format``, ``json_schema`` or Ollama's ``format``),
        checked; None: free text."""
        fmt = self.response_format
        given = [name for name, value in (("response_format", fmt is not None and fmt.type != "text"),
                                          ("json_schema", self.json_schema is not None), ("format", bool(self.format)))
                 if value]
        if len(given) > 1:
            raise ApiError(400, "invalid_input", f"{given[1]}: give it or {given[0]}, not both", param=given[1])
        if self.json_schema is not None:
            return check_schema(self.json_schema, "json_schema")
        if self.format:
            return {"type": "object"} if self.format == "json" else check_schema(self.format, "format")
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
        param = where.partition(".")[0]
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
