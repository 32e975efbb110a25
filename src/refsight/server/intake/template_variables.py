"""The chat template's variables a request sets, as llama-server and vLLM read them, against the served template.

Three fields set them: ``chat_template_kwargs`` (vLLM's and llama-server's: each key a variable),
``reasoning_effort`` (OpenAI's, read as llama-server reads it: the ``reasoning_effort`` variable, ``"none"``
setting ``enable_thinking`` false instead) and ``think`` (Ollama's, which Open WebUI also sends on ``/v1``:
``enable_thinking``; a level ``"low"``/``"medium"``/``"high"`` sets ``reasoning_effort`` too). Two fields that set
one variable to different values are a 400 naming the second.

A variable the served template reads is handed to it (:attr:`refsight.requests.GenerationRequest.template_variables`);
one it never reads changes nothing, so the field that set it is named in the reply's ``refsight.ignored``, as
llama-server answers a model that cannot think (200, the variable unread). Ollama answers ``think`` on such a model
with a 400 (``"MODEL" does not support thinking``): its routes ask for that (``refuse_unthinking``). A variable
refsight's render sets itself (:data:`~refsight.requests.RESERVED_TEMPLATE_VARIABLES`) is refused by name.

The server's own (:attr:`~refsight.server.ServerConfig.template_variables`: llama-server's ``--reasoning`` and
``--chat-template-kwargs``) go under the request's: a variable the request sets is the request's.
"""

from __future__ import annotations

from typing import Any

from ...requests import RESERVED_TEMPLATE_VARIABLES
from ..edge.http_errors import ApiError

__all__ = ["template_variables", "THINKING_VARIABLES"]

#: The variables a template reads when it can think (Qwen 3's and GLM's switch, gpt-oss's effort).
THINKING_VARIABLES = ("enable_thinking", "reasoning_effort")


def _set_by(kwargs: dict[str, Any] | None, reasoning_effort: str | None, think: Any) -> list[tuple[str, str, Any]]:
    """``(field, variable, value)`` for every variable the fields set, in the fields' order."""
    setting = [(f"chat_template_kwargs.{key}", key, value) for key, value in (kwargs or {}).items()]
    if reasoning_effort == "none":  # llama-server: "none" turns thinking off
        setting.append(("reasoning_effort", "enable_thinking", False))
    elif reasoning_effort is not None:
        setting.append(("reasoning_effort", "reasoning_effort", reasoning_effort))
    if think is not None:
        setting.append(("think", "enable_thinking", think is not False))
        if isinstance(think, str):
            setting.append(("think", "reasoning_effort", think))
    return setting


def template_variables(
    service: Any, kwargs: dict[str, Any] | None = None, reasoning_effort: str | None = None, think: Any = None, *,
    refuse_unthinking: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """The variables the request sets that the served template reads, and the fields that set only variables it
    never reads (to be named in ``refsight.ignored``). ``refuse_unthinking``: the model name of Ollama's 400 for a
    ``think`` that asks for thinking where the template reads no thinking variable."""
    setting = _set_by(kwargs, reasoning_effort, think)
    variables: dict[str, Any] = {}
    by: dict[str, str] = {}
    for field, variable, value in setting:
        if variable in RESERVED_TEMPLATE_VARIABLES:
            raise ApiError(400, "invalid_input", f"{field}: refsight sets {variable} from the request itself",
                           param=field)
        if variable in variables and variables[variable] != value:
            raise ApiError(400, "invalid_input", f"{field}: sets {variable} otherwise than {by[variable]} does; give one",
                           param=field)
        variables[variable] = value
        by.setdefault(variable, field)
    defaults = service.config.template_variables
    read = {name: value for name, value in {**defaults, **variables}.items() if service.template_reads(name)}
    used = {field for field, variable, _ in setting if variable in read}
    if refuse_unthinking is not None and think not in (None, False) and "think" not in used:
        # Ollama's own words (its %q of the model's name).
        raise ApiError(400, "unsupported", f'"{refuse_unthinking}" does not support thinking', param="think")
    return read, [field for field in dict.fromkeys(f for f, _, _ in setting) if field not in used]
