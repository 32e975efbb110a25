"""The messages of an OpenAI chat request, and their image parts as engine segments.

An image part is, in this order of checks:

- a payload (a base64 ``data:`` URL): those pixels. With a ``uuid`` beside it (vLLM's
  meaning) they are also remembered under that uuid for the tenant (:mod:`.media_uuids`);
  the same uuid with other pixels replaces what it held, and the answer is about the
  pixels sent now, exactly as a request without the uuid;
- no payload (``image_url: null`` or an empty url) and a ``uuid``: what this tenant sent
  before under it; a miss is a 400 naming the uuid;
- a stored reference: ``refsight://ref/<id>``, or this server's own URL of its image,
  ``http://HOST:PORT/v1/references/<id>/image`` (clients that accept only http URLs);
  a uuid beside a reference is refused (the reference already has a name);
- any other ``http(s)`` URL is refused: the server fetches nothing on a client's behalf.

Nothing ever stands in for the image a part names: every case is the pixels it says, or a 400.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, ConfigDict, Field

from .. import ReferenceSegment, check_text
from .bodies import decode_data_url
from .errors import ApiError
from .media_uuids import MAX_UUID_CHARS, MediaUuids, UuidUse

__all__ = [
    "ImageURL", "ContentPart", "Message", "PartResolver", "messages_to_segments", "template_segments", "own_origins",
    "REF_URL_PREFIX", "REFERENCE_IMAGE_PATH",
]

#: URL scheme naming a stored reference instead of sending its bytes.
REF_URL_PREFIX = "refsight://ref/"
#: The path of a reference's image on this server (``GET`` serves it; as a part's url it names the reference).
REFERENCE_IMAGE_PATH = re.compile(r"/v1/references/(?P<id>[^/]+)/image")
#: The chat role each OpenAI role is rendered as.
_ROLE = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


class ImageURL(BaseModel):
    """The ``image_url`` object of a part: a data URL, ``refsight://ref/<id>`` or this server's reference URL."""

    model_config = ConfigDict(extra="allow")
    url: str = ""
    detail: str | None = None


class ContentPart(BaseModel):
    """One part of a message: text, or an image (``image_url``, a ``uuid``, or both)."""

    model_config = ConfigDict(extra="allow")
    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None
    uuid: str | None = Field(
        None, description="vLLM's media uuid: the client's cache key for the image sent with it (or sent before)"
    )


class Message(BaseModel):
    """A chat message."""

    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart] | None = None


@dataclass
class PartResolver:
    """Turns image parts into segments for one request of one tenant, and records each uuid's use.

    ``decode(data, label)`` decodes sent bytes under the server's limits; ``origins`` are the
    ``host:port`` spellings of this server (its reference URLs name references).
    """

    decode: Callable[[bytes, str], Any]
    namespace: str
    uuids: MediaUuids
    origins: frozenset[str] = frozenset()
    used: list[UuidUse] = field(default_factory=list)

    def image(self, part: ContentPart, where: str) -> Any:
        """The segment of one image part (see the module's docstring for the cases)."""
        url = part.image_url.url if part.image_url is not None else ""
        uuid = self._uuid(part.uuid, where)
        if url.startswith("data:"):
            image = self.decode(decode_data_url(url, f"{where}.image_url.url"), f"{where}.image_url")
            if uuid is not None:
                self.used.append(self.uuids.remember(self.namespace, uuid, image))
            return image
        reference = self._reference(url, where)
        if reference is not None:
            if uuid is not None:
                raise ApiError(
                    400, "invalid_input", f"{where}.uuid: a stored reference is named by its URL; drop the uuid",
                    param=f"{where}.uuid",
                )
            return reference
        if url:
            return self._refuse_url(url, where)
        if uuid is None:
            raise ApiError(
                400, "invalid_input", f"{where}.image_url: give a data: URL, {REF_URL_PREFIX}<id>, or a uuid sent before",
                param=where,
            )
        return self._lookup(uuid, where)

    def _uuid(self, uuid: str | None, where: str) -> str | None:
        if uuid is None:
            return None
        check_text(uuid, f"{where}.uuid")
        if not uuid or len(uuid) > MAX_UUID_CHARS:
            raise ApiError(
                400, "invalid_input", f"{where}.uuid: give 1 to {MAX_UUID_CHARS} characters", param=f"{where}.uuid"
            )
        return uuid

    def _lookup(self, uuid: str, where: str) -> Any:
        image = self.uuids.lookup(self.namespace, uuid)
        if image is None:
            raise ApiError(
                400, "uuid_not_found",
                f"{where}.uuid: no image was sent under uuid {uuid!r} (or it was evicted); send the image with it "
                f"(a stored reference is {REF_URL_PREFIX}<id>)",
                param=f"{where}.uuid",
            )
        self.used.append(UuidUse(uuid, "looked_up"))
        return image

    def _reference(self, url: str, where: str) -> ReferenceSegment | None:
        if url.startswith(REF_URL_PREFIX):
            ref_id = url[len(REF_URL_PREFIX):]
        else:
            parts = urlsplit(url) if url.startswith(("http://", "https://")) else None
            match = REFERENCE_IMAGE_PATH.fullmatch(parts.path) if parts is not None else None
            if match is None or parts.netloc.lower() not in self.origins or parts.query or parts.fragment:
                return None
            ref_id = unquote(match["id"])
        if not ref_id:
            raise ApiError(400, "invalid_input", f"{where}.image_url.url: {REF_URL_PREFIX} needs a reference id", param=where)
        return ReferenceSegment(ref_id)

    def _refuse_url(self, url: str, where: str) -> Any:
        if url.startswith(("http://", "https://")):
            raise ApiError(
                400, "unsupported",
                f"{where}.image_url.url: remote URLs are not fetched; send a data: URL, {REF_URL_PREFIX}<id>, "
                "or this server's /v1/references/<id>/image URL",
                param=where,
            )
        raise ApiError(
            400, "invalid_input", f"{where}.image_url: give a data: URL, {REF_URL_PREFIX}<id>, or a uuid sent before",
            param=where,
        )


def messages_to_segments(messages: list[Message], resolver: PartResolver) -> tuple[list[Any], list[tuple[str, int]]]:
    """Messages as engine segments (text, ReferenceSegment, or decoded images) and their turns.

    Returns the flat segments and ``(role, count)`` per message (``developer`` is rendered as
    ``system``), as :meth:`refsight.Engine.chat` takes them.
    """
    segments: list[Any] = []
    turns: list[tuple[str, int]] = []
    for i, message in enumerate(messages):
        before = len(segments)
        content = message.content
        if isinstance(content, str):
            segments.append(content)
        elif content is not None:
            for j, part in enumerate(content):
                where = f"messages[{i}].content[{j}]"
                if part.type == "text":
                    if part.text is None:
                        raise ApiError(400, "invalid_input", f"{where}.text: a text part needs text", param=f"{where}.text")
                    segments.append(part.text)
                    continue
                if message.role != "user":
                    raise ApiError(400, "unsupported", f"{where}: images are accepted in user messages only", param=where)
                segments.append(resolver.image(part, where))
        turns.append((_ROLE[message.role], len(segments) - before))
    return segments, turns


def template_segments(messages: list[Message], marker: str) -> tuple[list[str], list[tuple[str, int]]]:
    """Messages as texts for a chat template (each image part the media ``marker``, nothing decoded) and their turns."""
    texts: list[str] = []
    turns: list[tuple[str, int]] = []
    for message in messages:
        content = message.content
        parts = [content] if isinstance(content, str) else [
            (part.text or "") if part.type == "text" else marker for part in content or []
        ]
        texts += parts
        turns.append((_ROLE[message.role], len(parts)))
    return texts, turns


def own_origins(host_header: str | None, host: str, port: int) -> frozenset[str]:
    """The ``host:port`` spellings that are this server: the request's ``Host`` and the bound address."""
    names = {f"{host}:{port}", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"}
    if host_header:
        names.add(host_header)
    return frozenset(n.lower() for n in names)
