"""Ollama's request bodies (``/api/chat``, ``/api/generate``, ``/api/show``) and what they mean to refsight.

The sampling ``options`` become the fields every text route reads (:mod:`..intake.generation_body`), so they
are honoured, accepted or refused by the same rule: ``temperature``, ``top_k``, ``top_p``, ``min_p``,
``seed``, ``stop``, ``num_predict`` (-1 and -2: the server's limit), ``repeat_penalty``,
``presence_penalty``, ``frequency_penalty`` are honoured; ``repeat_last_n``, ``typical_p``, ``tfs_z``,
``mirostat`` only at their no-op values; ``num_ctx`` is accepted, the served context used whatever it
says (the context is fixed at start, ``refsight serve -c N``; the reply's ``refsight.num_ctx`` names it);
the runtime's resource knobs (``num_gpu``, ``num_thread`` ...) are hints that cannot change an answer;
any other option is a 400 naming it. ``format`` ``"json"`` or a JSON schema is the constrained decoder's
schema. ``tools`` are rendered by the model's chat template and its calls read back into ``message.tool_calls``
(:mod:`..intake.tool_fields`), an assistant message's ``tool_calls`` and a ``tool`` message (with ``tool_name``)
rendered on the next turn. ``think`` and ``logprobs`` are refused by name (no model refsight serves thinks through
it); ``keep_alive`` is accepted (the model stays loaded for the server's life).

Images are base64, or a stored reference: ``refsight://ref/<id>`` as the entry, or as the base64 of
that text (what a client that encodes every image sends for ``b"refsight://ref/<id>"``). In a message
they come before its text, as Ollama places them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..intake.completion_parts import media_segment
from ..edge.http_errors import ApiError
from ..intake.bodies import IntegerOrNull, Number
from ..intake.generation_body import GenerationBody, check_generation, check_schema
from ..intake.messages import PartResolver
from ..intake.tool_fields import history_call
from ...tools import ToolTurn

__all__ = [
    "OllamaMessage", "OllamaChatBody", "OllamaGenerateBody", "OllamaShowBody", "OPTION_FIELDS", "RUNTIME_HINTS",
    "ollama_name", "check_model", "check_refused", "check_num_ctx", "generation", "schema_of", "chat_segments",
    "ollama_tool_turns",
]

#: Ollama's option → the :class:`~..intake.generation_body.GenerationBody` field that carries it.
OPTION_FIELDS = {
    "temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p", "seed": "seed", "stop": "stop",
    "num_predict": "n_predict", "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty", "repeat_last_n": "repeat_last_n", "typical_p": "typical_p",
    "tfs_z": "tfs_z", "mirostat": "mirostat",
}
#: Options about the runtime's resources (or settings only read with mirostat on): they cannot change an answer here.
RUNTIME_HINTS = frozenset({
    "numa", "num_batch", "num_gpu", "main_gpu", "low_vram", "use_mmap", "use_mlock", "num_thread", "logits_all",
    "num_keep", "penalize_newline", "mirostat_tau", "mirostat_eta",
})
#: The hints Ollama types as numbers (the others are booleans): even ignored, ``true`` is no number.
_NUMBER_HINTS = frozenset({"num_batch", "num_gpu", "main_gpu", "num_thread", "num_keep", "mirostat_tau", "mirostat_eta"})
_FIELD_OPTIONS = {field: option for option, field in OPTION_FIELDS.items()}
#: An Ollama name without a tag means ``:latest``.
_LATEST = ":latest"

Format = Literal["", "json"] | dict[str, Any] | None


class OllamaMessage(BaseModel):
    """A chat message: ``role``, ``content``, ``images`` (base64, or a stored reference)."""

    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: list[str] | None = Field(None, max_length=64)
    thinking: str | None = None
    tool_calls: list[Any] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class _OllamaRequest(BaseModel):
    """What ``/api/chat`` and ``/api/generate`` share."""

    model_config = ConfigDict(extra="forbid")
    model: str = Field(min_length=1)
    format: Format = None
    options: dict[str, Any] | None = None
    stream: bool = Field(True, description="NDJSON lines as tokens come (Ollama's default); false: one object")
    keep_alive: Number | str | None = Field(None, description="accepted: the model stays loaded for the server's life")
    think: bool | Literal["low", "medium", "high"] | None = None
    logprobs: bool | None = None
    top_logprobs: IntegerOrNull = None


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


class OllamaShowBody(BaseModel):
    """``POST /api/show`` (``name`` is the older spelling of ``model``)."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    name: str | None = None
    verbose: bool | None = None


def ollama_name(service: Any) -> str:
    """The served model as Ollama names models: an ``ollama:`` model by its store name, else the served name."""
    name = service.served_model
    if name.startswith("ollama:"):
        name = name[len("ollama:"):]
    return name if ":" in name.rsplit("/", 1)[-1] else name + _LATEST


def check_model(model: str, service: Any) -> None:
    """404 (Ollama's ``model "x" not found``) unless ``model`` names the served model, ``:latest`` or not."""
    names = {*service.model_names, ollama_name(service)}
    names |= {n[len("ollama:"):] for n in names if n.startswith("ollama:")}
    names |= {n[: -len(_LATEST)] for n in names if n.endswith(_LATEST)} | {n + _LATEST for n in names}
    if model not in names:
        raise ApiError(404, "model_not_found", f'model "{model}" not found: this server serves "{ollama_name(service)}" '
                       "(refsight serves the model it was started with)", param="model")


def check_refused(body: _OllamaRequest) -> None:
    """400 naming what refsight does not do: thinking, log probabilities."""
    if body.think not in (None, False):
        raise ApiError(400, "unsupported", "think: thinking is not supported by refsight (send think: false or leave it out)",
                       param="think")
    if body.logprobs or body.top_logprobs:
        raise ApiError(400, "unsupported", "logprobs: log probabilities are not returned", param="logprobs")


def generation(options: dict[str, Any] | None, service: Any, limit: int) -> tuple[int, Any]:
    """``options`` as the token bound and the :class:`~refsight.Sampling` (the model's params fill what is unset)."""
    options = dict(options or {})
    check_num_ctx(options.pop("num_ctx", None))
    unknown = sorted(set(options) - set(OPTION_FIELDS) - RUNTIME_HINTS)
    if unknown:
        raise ApiError(400, "unsupported", f"options.{unknown[0]}: not an option refsight knows", param=f"options.{unknown[0]}")
    _check_number_hints(options)
    fields = {OPTION_FIELDS[k]: v for k, v in options.items() if k in OPTION_FIELDS}
    if fields.get("n_predict") == -2:  # Ollama: fill the context; here: up to the server's limit, as -1
        fields["n_predict"] = -1
    try:
        body = GenerationBody.model_validate(fields)
        return check_generation(body, service, None, limit)
    except ValidationError as e:
        error = e.errors()[0]
        where = _option(".".join(str(p) for p in error.get("loc", ())))
        raise ApiError(400, "invalid_input", f"{where}: {error.get('msg', 'invalid')}", param=where) from None
    except ApiError as e:
        where = _option(e.param or "")
        raise ApiError(e.status, e.code, e.message.replace(f"{e.param}:", f"{where}:", 1), param=where) from None


def _check_number_hints(options: dict[str, Any]) -> None:
    """400 naming a runtime hint that Ollama types as a number but that is not one (``true`` included)."""
    for name in sorted(_NUMBER_HINTS & set(options)):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ApiError(400, "invalid_input", f"options.{name}: must be a number, not {value!r}"[:200],
                           param=f"options.{name}")


def _option(field: str) -> str:
    """The ``options.NAME`` an Ollama client sent for the :class:`GenerationBody` ``field`` (``n_predict.0`` too)."""
    head, dot, rest = field.partition(".")
    return f"options.{_FIELD_OPTIONS.get(head, head)}{dot}{rest}"


def check_num_ctx(num_ctx: Any) -> int | None:
    """``options.num_ctx``: a positive integer (clients send it whenever their user sets a context length), or
    None. It cannot resize the context, which is fixed at start (``refsight serve -c N``): the answer has the
    served context whatever the value, and says so (the reply's ``refsight.num_ctx``)."""
    if num_ctx is not None and (isinstance(num_ctx, bool) or not isinstance(num_ctx, int) or num_ctx < 1):
        raise ApiError(400, "invalid_input", f"options.num_ctx: must be a positive integer, not {num_ctx!r}",
                       param="options.num_ctx")
    return num_ctx


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
