"""Ollama's request bodies (``/api/chat``, ``/api/generate``, ``/api/show``) and what they mean to refsight.

The ``options`` are read as the generation fields every text route reads (:class:`OllamaOptions`, a
:class:`~..intake.generation_body.GenerationBody`), so they are honoured, taken at a neutral value or named as
ignored by the same rule and with the same strict types (``"num_predict": "5"`` is a 400 naming
``options.num_predict``): ``temperature``, ``top_k``, ``top_p``, ``min_p``, ``seed``, ``stop``, ``num_predict``
(-1 and -2: the server's limit), ``repeat_penalty`` over the last ``repeat_last_n`` tokens (where the backend
honours the window; 0: no penalty), ``presence_penalty``, ``frequency_penalty``, and what Open WebUI also puts in
``options``: ``logit_bias`` (``""``: none) and ``reasoning_effort`` (the template's variable) are honoured;
``typical_p``, ``tfs_z``, ``mirostat`` only at their neutral values; ``num_ctx`` is accepted, the served context
used whatever it says (the context is fixed at start, ``refsight serve -c N``; the reply's ``refsight.num_ctx``
names it); the runtime's resource knobs (``num_gpu``, ``num_thread`` ...) are hints; every option refsight does not
know or does not read here is named in the reply's ``refsight.ignored`` as ``options.NAME`` (Ollama logs and
ignores an option it does not know). ``format`` ``"json"`` or a JSON schema is the constrained decoder's schema.
``tools`` are rendered by the model's chat template and its calls read back into ``message.tool_calls``
(:mod:`..intake.tool_fields`), an assistant message's ``tool_calls`` and a ``tool`` message (with ``tool_name``)
rendered on the next turn. ``think`` sets the chat template's ``enable_thinking`` (a level: and its
``reasoning_effort``) where the template reads it; on a model whose template reads neither, a thinking request is
Ollama's own 400 (``"MODEL" does not support thinking``) and ``think: false`` changes nothing
(:mod:`..intake.template_variables`). ``logprobs`` is refused by name; ``keep_alive`` is accepted (the model stays loaded for the
server's life); a top-level field refsight does not know is named in ``refsight.ignored``.

Images are base64, or a stored reference: ``refsight://ref/<id>`` as the entry, or as the base64 of
that text (what a client that encodes every image sends for ``b"refsight://ref/<id>"``). In a message
they come before its text, as Ollama places them.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, ValidationError

from ..intake.completion_parts import media_segment
from ..edge.http_errors import ApiError
from ..edge.validation import error_field, validation_message
from ..intake.dialect_body import DialectBody
from ..intake.generation_body import GenerationBody, check_generation, check_schema
from ..intake.messages import PartResolver
from ..intake.template_variables import template_variables
from ..intake.tool_fields import history_call
from ...tools import ToolTurn

__all__ = [
    "OllamaMessage", "OllamaChatBody", "OllamaGenerateBody", "OllamaShowBody", "OllamaOptions",
    "ollama_name", "check_model", "check_requested_model", "check_refused", "generation", "schema_of", "chat_segments",
    "thinking", "ollama_tool_turns",
]

#: Ollama's options whose generation field has another name.
_RENAMED = {"num_predict": "n_predict"}
_FIELD_OPTIONS = {field: option for option, field in _RENAMED.items()}
#: An Ollama name without a tag means ``:latest``.
_LATEST = ":latest"

Format = Literal["", "json"] | dict[str, Any] | None


class OllamaOptions(GenerationBody):
    """Ollama's ``options`` as the generation fields (``num_predict`` is ``n_predict``). The fields the Ollama
    routes take elsewhere or not at all (the schema is ``format`` at the top level, there are no log
    probabilities or progress events in Ollama's replies) are hints here; ``reasoning_effort`` is honoured."""

    hints: ClassVar[frozenset[str]] = (GenerationBody.hints - {"reasoning_effort"}) | {
        "response_format", "json_schema", "format", "return_progress", "timings_per_token", "n_probs",
        "post_sampling_probs"}

    def requested_logprobs(self) -> tuple[int | None, str]:
        """None: an Ollama reply carries no log probabilities."""
        return None, "n_probs"


class OllamaMessage(DialectBody):
    """A chat message: ``role``, ``content``, ``images`` (base64, or a stored reference)."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = Field(None, max_length=64)
    thinking: str | None = None
    tool_calls: list[Any] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _OllamaRequest(DialectBody):
    """What ``/api/chat`` and ``/api/generate`` share."""

    #: Ollama's fields that cannot change the answer here (context shifting: refsight never shifts).
    hints: ClassVar[frozenset[str]] = frozenset({"shift", "truncate"})
    model: str = Field(min_length=1)
    format: Format = None
    options: dict[str, Any] | None = None
    stream: bool = Field(True, description="NDJSON lines as tokens come (Ollama's default); false: one object")
    keep_alive: float | str | None = Field(None, description="accepted: the model stays loaded for the server's life")
    think: bool | Literal["low", "medium", "high"] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    shift: bool | None = None
    truncate: bool | None = None


class OllamaChatBody(_OllamaRequest):
    """``POST /api/chat``."""

    messages: list[OllamaMessage] = Field(default_factory=list, max_length=256)
    tools: list[Any] | None = None


class OllamaGenerateBody(_OllamaRequest):
    """``POST /api/generate``."""

    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[str] | None = Field(None, max_length=64)


class OllamaShowBody(DialectBody):
    """``POST /api/show`` (``name`` is the older spelling of ``model``)."""

    model: str | None = None
    name: str | None = None
    verbose: bool | None = None


def ollama_name(service: Any) -> str:
    """The served model as Ollama names models: an ``ollama:`` model by its store name, else the served name."""
    name = service.served_model
    if name.startswith("ollama:"):
        name = name[len("ollama:"):]
    return name if ":" in name.rsplit("/", 1)[-1] else name + _LATEST


def check_requested_model(model: str, service: Any) -> None:
    """A generation's ``model`` by the rule every generation route follows (``/v1``, llama-server's, Ollama's): any
    name is answered by the served model, the reply's ``model`` saying which, unless ``--strict-model-name`` makes
    another name a 404. A lookup by name (``/api/show``, ``GET /v1/models/{id}``) is always exact."""
    if service.config.strict_model_names:
        check_model(model, service)


def check_model(model: str, service: Any) -> None:
    """404 (Ollama's ``model "x" not found``) unless ``model`` names the served model, ``:latest`` or not."""
    names = {*service.model_names, ollama_name(service)}
    names |= {n[len("ollama:"):] for n in names if n.startswith("ollama:")}
    names |= {n[: -len(_LATEST)] for n in names if n.endswith(_LATEST)} | {n + _LATEST for n in names}
    if model not in names:
        raise ApiError(404, "model_not_found", f'model "{model}" not found: this server serves "{ollama_name(service)}" '
                       "(refsight serves the model it was started with)", param="model")


def check_refused(body: _OllamaRequest) -> None:
    """400 naming what refsight does not do: log probabilities."""
    if body.logprobs or body.top_logprobs:
        raise ApiError(400, "unsupported", "logprobs: log probabilities are not returned", param="logprobs")


def generation(options: dict[str, Any] | None, service: Any, limit: int) -> tuple[int, Any, OllamaOptions]:
    """``options`` as the token bound, the :class:`~refsight.Sampling` (the model's params fill what is unset) and
    the options read (:class:`OllamaOptions`); every 400 names ``options.NAME``."""
    fields = {_RENAMED.get(name, name): value for name, value in (options or {}).items()}
    if fields.get("n_predict") == -2:  # Ollama: fill the context; here: up to the server's limit, as -1
        fields["n_predict"] = -1
    try:
        body = OllamaOptions.model_validate(fields)
        return (*check_generation(body, service, None, limit), body)
    except ValidationError as e:
        where = _option(error_field(e.errors()[0]))
        message = validation_message([err for err in e.errors() if error_field(err) == error_field(e.errors()[0])])
        raise ApiError(400, "invalid_input", f"{where}:{message.partition(':')[2]}", param=where) from None
    except ApiError as e:
        where = _option(e.param or "")
        raise ApiError(e.status, e.code, e.message.replace(f"{e.param}:", f"{where}:", 1), param=where) from None


def thinking(body: _OllamaRequest, options: OllamaOptions | None, service: Any, raw: bool = False) -> tuple[dict, list]:
    """The chat template's variables of ``think`` and ``options.reasoning_effort``, and the fields named ignored;
    Ollama's 400 for a thinking request to a model that cannot think. A raw prompt renders no template: its
    ``think`` and ``reasoning_effort`` are named ignored (after that check)."""
    effort = options.reasoning_effort if options is not None else None
    variables, unread = template_variables(service, None, effort, body.think, refuse_unthinking=ollama_name(service))
    if raw:
        unread = [name for name, value in (("think", body.think), ("reasoning_effort", effort)) if value is not None]
        variables = {}
    return variables, [f"options.{name}" if name == "reasoning_effort" else name for name in unread]


def _option(field: str) -> str:
    """The ``options.NAME`` an Ollama client sent for the :class:`GenerationBody` ``field`` (``n_predict.0`` too)."""
    head, dot, rest = field.partition(".")
    return f"options.{_FIELD_OPTIONS.get(head, head)}{dot}{rest}"


def schema_of(fmt: Format) -> dict[str, Any] | None:
    """``format``: ``"json"`` → any JSON object, a JSON schema → that schema (checked), empty → free text."""
    if fmt in (None, ""):
        return None
    if fmt == "json":
        return {"type": "object"}
    return check_schema(fmt, "format")


def chat_segments(
    messages: list[OllamaMessage], resolver: PartResolver, system: str | None = None, where: str = "messages"
) -> tuple[list[Any], list[tuple[str, int]]]:
    """Messages as the engine's segments and turns: each message's images (before its text), then its text.

    ``system``: the model's own system prompt (an Ollama model's system layer), used when no message is a
    system message, as Ollama does. ``where`` names the messages in errors (``""``: one message, the body's
    own ``images``, as ``/api/generate`` has them).
    """
    segments: list[Any] = []
    turns: list[tuple[str, int]] = []
    if system and not any(m.role == "system" for m in messages):
        segments, turns = [system], [("system", 1)]
    for i, message in enumerate(messages):
        label = f"{where}[{i}]" if where else ""
        _check_message(message, label or "prompt")
        images = [
            media_segment(item, f"{label}.images[{j}]" if label else f"images[{j}]", resolver)
            for j, item in enumerate(message.images or [])
        ]
        segments += [*images, message.content]
        turns.append((message.role, len(images) + 1))
    return segments, turns


def ollama_tool_turns(messages: list[OllamaMessage], system: str | None = None) -> list[ToolTurn | None] | None:
    """Each message's tool fields, in the turns :func:`chat_segments` lays out (after the model's own system turn where
    it adds one): an assistant's ``tool_calls`` (``function.name``, ``function.arguments`` an object), a tool result's
    ``tool_name`` (and ``tool_call_id``, which LangChain sends); None when no message has any."""
    turns: list[ToolTurn | None] = [None] if system and not any(m.role == "system" for m in messages) else []
    for i, message in enumerate(messages):
        calls = [_history_call(call, f"messages[{i}].tool_calls[{j}]")
                 for j, call in enumerate(message.tool_calls or [])]
        if calls and message.role != "assistant":
            raise ApiError(400, "invalid_input", f"messages[{i}].tool_calls: only an assistant message calls tools",
                           param=f"messages[{i}].tool_calls")
        tool = ToolTurn(call_id=message.tool_call_id, name=message.tool_name) if message.role == "tool" else None
        turns.append(ToolTurn(calls) if calls else tool)
    return turns if any(t is not None for t in turns) else None


def _history_call(call: Any, where: str) -> Any:
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise ApiError(400, "invalid_input", f"{where}: a tool call is {{\"function\": {{\"name\", \"arguments\"}}}}",
                       param=where)
    return history_call(call.get("id"), function.get("name"), function.get("arguments"), where)


def _check_message(message: OllamaMessage, where: str) -> None:
    if message.thinking:
        raise ApiError(400, "unsupported", f"{where}.thinking: thinking is not supported by refsight", param=where)
    if message.images and message.role != "user":
        raise ApiError(400, "unsupported", f"{where}.images: images are accepted in user messages only", param=where)
