"""The inputs of the embedding and rerank routes, in every dialect's forms, read on the event loop and resolved in
the work pool.

An *input* is what one vector (or one query, one document) is made of: its parts in order, each a text, a token id,
or an image still to resolve. The forms, read once here for every route:

- a string: one text input;
- token ids (``[12, 34]``, OpenAI's and llama-server's), or ids mixed with strings (``[12, "text", 34]``,
  llama-server's ``tokenize_mixed``): one input, the ids read in the embedder's own vocabulary;
- a list whose items hold no number: one input per item (a string, a list of ids, or an object below);
- ``{"content": [parts]}`` (llama-server's and vLLM's): chat content parts, ``text`` and ``image_url`` (a data URL,
  ``refsight://ref/<id>``, this server's reference URL, or an allowed remote URL), one input;
- ``{"prompt_string": "... <__media__> ...", "multimodal_data": [...]}`` (llama-server's): the text split at the media
  marker, one ``multimodal_data`` item (base64, a data URL or a reference URL) at each marker, one input;
- ``{"text": ...}`` or ``{"image": ...}`` (Jina's documents): one input;
- vLLM's ``messages`` (:func:`messages_input`): every message's parts in order, one input.

Images are admitted against the request's bounds (``max_images_per_request`` per input: :func:`per_item`;
``max_request_pixels`` per request) and decoded when the inputs are resolved, in the work pool (:func:`resolved`),
never on the event loop.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ..edge.http_errors import ApiError
from .completion_parts import media_segment
from .messages import ContentPart, ImageURL, Message, PartResolver, check_image_role
from .prompt_limit import check_prompt_chars

__all__ = [
    "ImagePart", "MediaItem", "check_input_chars", "messages_input", "per_item", "read_input", "read_inputs", "resolved",
]


@dataclass(frozen=True)
class ImagePart:
    """A chat content part's image, resolved by :meth:`PartResolver.image`."""

    part: ContentPart
    where: str


@dataclass(frozen=True)
class MediaItem:
    """A ``multimodal_data`` item (or a Jina ``image``), resolved as ``/completion`` resolves one."""

    item: str
    where: str


def _field(where: str) -> str:
    """The body's field a path is in (``input[2].content[0]``: ``input``), the error's ``param``."""
    return where.split("[")[0].split(".")[0]


def _bad(where: str, reason: str) -> ApiError:
    return ApiError(400, "invalid_input", f"{where}: {reason}", param=_field(where))


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_inputs(value: Any, field: str, marker: str) -> list[list[Any]]:
    """The inputs of a body's ``field`` (see the module docstring); 400 naming it for any other shape."""
    if isinstance(value, list) and not any(_is_id(item) for item in value):
        if not value:
            raise _bad(field, "is empty: give a string, token ids or a list of inputs")
        return [read_input(item, f"{field}[{i}]", marker) for i, item in enumerate(value)]
    return [read_input(value, field, marker)]


def read_input(value: Any, where: str, marker: str) -> list[Any]:
    """One input's parts: a string, ids (mixed with strings), or one of the objects of the module docstring."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        if not value or not all(isinstance(item, str) or _is_id(item) for item in value):
            raise _bad(where, "give token ids (integers), mixed with strings if need be")
        return list(value)
    if isinstance(value, dict):
        return _object_input(value, where, marker)
    raise _bad(where, f"give a string, token ids or an object, not {type(value).__name__}")


def _object_input(value: dict[str, Any], where: str, marker: str) -> list[Any]:
    keys = set(value)
    if keys == {"content"}:
        return content_parts(value["content"], f"{where}.content")
    if "prompt_string" in keys and keys <= {"prompt_string", "multimodal_data"}:
        return _prompt_object(value, where, marker)
    if keys in ({"text"}, {"image"}):
        (key, item), = value.items()
        if not isinstance(item, str):
            raise _bad(f"{where}.{key}", "must be a string")
        return [item] if key == "text" else [MediaItem(item, f"{where}.image")]
    raise _bad(where, "an object input is {\"content\": [parts]}, {\"prompt_string\", \"multimodal_data\"}, "
               f"{{\"text\"}} or {{\"image\"}}; got the keys {sorted(keys)}")


def content_parts(parts: Any, where: str) -> list[Any]:
    """Chat content parts as an input's parts: ``text`` as text, ``image_url`` as an image to resolve."""
    if not isinstance(parts, list) or not parts:
        raise _bad(where, "must be a non-empty list of content parts")
    out: list[Any] = []
    for j, part in enumerate(parts):
        here = f"{where}[{j}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            out.append(part["text"])
        elif kind == "image_url" and isinstance(part.get("image_url"), dict):
            url = part["image_url"].get("url")
            if not isinstance(url, str):
                raise _bad(f"{here}.image_url.url", "must be a string")
            out.append(ImagePart(ContentPart(type="image_url", image_url=ImageURL(url=url)), here))
        elif kind in ("input_audio", "input_video", "video_url", "audio_url", "image_embeds"):
            raise ApiError(400, "unsupported", f"{here}: {kind} parts are not embedded here (text and images are)",
                           param=_field(where))
        else:
            raise _bad(here, "a content part is {\"type\": \"text\", \"text\"} or {\"type\": \"image_url\", "
                       "\"image_url\": {\"url\"}}")
    return out


def _prompt_object(value: dict[str, Any], where: str, marker: str) -> list[Any]:
    """llama-server's prompt object: the text split at the media marker, an item at each marker."""
    text, media = value["prompt_string"], value.get("multimodal_data") or []
    if not isinstance(text, str) or not isinstance(media, list) or not all(isinstance(m, str) for m in media):
        raise _bad(where, "prompt_string is a string, multimodal_data a list of strings")
    pieces = text.split(marker)
    if len(pieces) - 1 != len(media):
        raise _bad(f"{where}.multimodal_data", f"{len(media)} item(s) for {len(pieces) - 1} media marker(s) {marker}")
    out: list[Any] = [pieces[0]]
    for i, (item, piece) in enumerate(zip(media, pieces[1:])):
        out += [MediaItem(item, f"{where}.multimodal_data[{i}]"), piece]
    return [part for part in out if part != ""]


def messages_input(messages: list[Message]) -> list[Any]:
    """vLLM's chat embedding: every message's texts and images in order, one input (a line between messages)."""
    out: list[Any] = []
    for i, message in enumerate(messages):
        if out:
            out.append("\n")
        content = message.content
        if isinstance(content, str):
            out.append(content)
            continue
        for j, part in enumerate(content or []):
            where = f"messages[{i}].content[{j}]"
            if part.type == "text":
                out.append(part.text or "")
            else:
                check_image_role(message, where)
                out.append(ImagePart(part, where))
    return out


def check_input_chars(inputs: list[list[Any]], limit: int, field: str) -> None:
    """Each input's texts within the prompt limit's characters (before any tokenizer sees them)."""
    for i, parts in enumerate(inputs):
        check_prompt_chars([p for p in parts if isinstance(p, str)], limit, f"{field}[{i}]" if len(inputs) > 1 else field)


def per_item(resolver: PartResolver, items: int) -> PartResolver:
    """``resolver`` bounding the images per input (or per document), not per request: each input is a vector (a
    document a prompt) of its own, so ``max_images_per_request`` bounds each; the decoded pixels stay bounded per
    request (``max_request_pixels``), each image released once hashed."""
    return replace(resolver, max_images=resolver.max_images * max(items, 1))


def resolved(inputs: list[list[Any]], resolver: PartResolver) -> list[list[Any]]:
    """The inputs with every image resolved (decoded under the request's bounds, or a stored reference): in the work
    pool. Token ids stay ids (the embedder reads them); texts stay texts."""
    out = []
    for parts in inputs:
        row: list[Any] = []
        for part in parts:
            if isinstance(part, ImagePart):
                row.append(resolver.image(part.part, part.where))
            elif isinstance(part, MediaItem):
                row.append(media_segment(part.item, part.where, resolver))
            else:
                row.append(part)
        out.append(row)
    return out
