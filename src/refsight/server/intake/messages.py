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

One request may name at most ``ServerConfig.max_images_per_request`` images (sent, looked up or
stored references alike: each is model work and prompt tokens) and decode at most
``ServerConfig.max_request_pixels`` pixels in total, checked from each image's header before its
pixels are decoded. Each image's decoded pixels are released once it is checked and hashed (and again
once it is encoded), so a request holds one decoded image at a time.
A uuid sent with pixels is remembered only when the request succeeds (:meth:`PartResolver.commit`).

How the messages end the prompt (:func:`prompt_end_of`: the answer's opening, the turns alone, or a final assistant
message continued) is read here too, by llama-server's rules, for every chat dialect (OpenAI's, llama-server's,
Anthropic's).
"""

from __future__ import annotations

import io
import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal
from urllib.parse import unquote, urlsplit

from PIL import Image
from pydantic import Field

from ... import ReferenceSegment
from ...inputs.text import check_text
from .bodies import decode_data_url
from .dialect_body import DialectBody
from ..edge.disconnect import client_stop
from ..edge.http_errors import ApiError
from .fetch_deadline import FetchDeadline
from .media_uuids import MAX_UUID_CHARS, MediaUuids, UuidUse
from .remote_media import RemoteMedia

__all__ = [
    "ImageURL", "ContentPart", "Message", "PartResolver", "messages_to_segments", "template_segments", "own_origins",
    "REF_URL_PREFIX", "REFERENCE_IMAGE_PATH", "check_image_role", "prompt_end_of", "chat_prompt_end",
]

#: URL scheme naming a stored reference instead of sending its bytes.
REF_URL_PREFIX = "refsight://ref/"
#: The path of a reference's image on this server (``GET`` serves it; as a part's url it names the reference).
REFERENCE_IMAGE_PATH = re.compile(r"/v1/references/(?P<id>[^/]+)/image")
#: The chat role each OpenAI role is rendered as.
_ROLE = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class ImageURL(DialectBody):
    """The ``image_url`` object of a part: a data URL, ``refsight://ref/<id>`` or this server's reference URL
    (OpenAI's ``detail`` is a hint: every image is read at the size the model's processor gives it)."""

    hints: ClassVar[frozenset[str]] = frozenset({"detail"})
    url: str = ""
    detail: str | None = None


class ContentPart(DialectBody):
    """One part of a message: text, or an image (``image_url``, a ``uuid``, or both)."""

    type: Literal["text", "image_url"]
    text: str | None = None
    image_url: ImageURL | None = None
    uuid: str | None = Field(
        None, description="vLLM's media uuid: the client's cache key for the image sent with it (or sent before)"
    )


class CalledFunction(DialectBody):
    """The ``function`` of a tool call in a conversation's history: its name and arguments (JSON text, as OpenAI
    sends them; an object is taken too)."""

    name: str
    arguments: str | dict[str, Any] | None = None


class HistoryCall(DialectBody):
    """A tool call an assistant message made earlier (``tool_calls``), sent back with the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(DialectBody):
    """A chat message: ``tool_calls`` on an assistant's, ``tool_call_id`` (and ``name``) on a tool result."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[HistoryCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None

    def ignored_fields(self, where: str = "") -> list[str]:
        """The base's, and ``name`` on any message but a tool result's (a participant's name no template reads)."""
        names = super().ignored_fields(where)
        return sorted([*names, f"{where}name"]) if self.name is not None and self.role != "tool" else names


@dataclass
class PartResolver:
    """Turns image parts into segments for one request of one tenant, and records each uuid's use.

    ``decode(data, label)`` decodes sent bytes under the server's limits; ``origins`` are the
    ``host:port`` spellings of this server (its reference URLs name references); ``max_images``
    and ``max_pixels`` bound the images of the request and their decoded pixels in total.
    """

    decode: Callable[[bytes, str], Any]
    namespace: str
    uuids: MediaUuids
    origins: frozenset[str] = frozenset()
    max_images: int = 16
    max_pixels: int = 80_000_000
    #: Images by URL the operator opted in to (``--allowed-media-domains``, ``--media-path``); None: none.
    remote: RemoteMedia | None = None
    #: The one deadline of all the request's fetches by URL, from the first; its client leaving ends it too.
    fetching: FetchDeadline | None = None
    #: Each uuid's use, in order; a uuid sent with pixels is ``(uuid, image)`` until :meth:`commit`.
    used: list[Any] = field(default_factory=list)
    images: int = 0
    pixels: int = 0

    @classmethod
    def for_request(cls, request: Any, service: Any, namespace: str, uuids: MediaUuids, config: Any) -> "PartResolver":
        """The resolver of one request under the server's limits and real addresses: the socket it was
        accepted on (never the ``Host`` header), the configured ones and ``allowed_hosts``."""
        host, port = (request.scope.get("server") or (config.host, config.port))[:2]
        names = (config.host, *config.allowed_hosts)
        return cls(
            service.decode, namespace, uuids, own_origins(host, port, names),
            max_images=config.max_images_per_request, max_pixels=config.max_request_pixels,
            remote=RemoteMedia(config.allowed_media_domains, config.media_path, config.max_media_bytes,
                               config.media_timeout_s),
        )

    def admit(self, where: str) -> None:
        """Count one more image of the request; 400 naming the limit past ``max_images``."""
        self.images += 1
        if self.images > self.max_images:
            raise ApiError(
                400, "too_many_images",
                f"{where}: more than {self.max_images} images in one request (max_images_per_request)",
                param=where,
            )

    def decode_bytes(self, data: bytes, where: str, label: str | None = None) -> Any:
        """Sent bytes decoded under the server's limits, counted against the request's images and pixels."""
        self.admit(where)
        return self._decode_admitted(data, where, label)

    def _decode_admitted(self, data: bytes, where: str, label: str | None = None) -> Any:
        width, height = _header_size(data)
        if self.pixels + width * height > self.max_pixels:
            raise ApiError(
                400, "too_many_pixels",
                f"{where}: the request's images hold more than {self.max_pixels} pixels in total (max_request_pixels)",
                param=where,
            )
        image = self.decode(data, label or where)
        width, height = image.size
        self.pixels += width * height
        # Decoded to check and hash it; decoded again only while it is encoded, one image at a time.
        image.release()
        return image

    def commit(self) -> list[UuidUse]:
        """Remember the uuids sent with pixels (call once the request succeeded) and return every use."""
        self.used = [
            self.uuids.remember(self.namespace, item[0], item[1]) if isinstance(item, tuple) else item
            for item in self.used
        ]
        return self.used

    def image(self, part: ContentPart, where: str) -> Any:
        """The segment of one image part (see the module's docstring for the cases)."""
        url = part.image_url.url if part.image_url is not None else ""
        uuid = self._uuid(part.uuid, where)
        if url.startswith("data:"):
            image = self.decode_bytes(decode_data_url(url, f"{where}.image_url.url"), where, f"{where}.image_url")
            if uuid is not None:
                # Kept only when the request succeeds: a failing request must leave nothing behind.
                self.used.append((uuid, image))
            return image
        self.admit(where)
        reference = self._reference(url, where)
        if reference is not None:
            if uuid is not None:
                raise ApiError(
                    400, "invalid_input", f"{where}.uuid: a stored reference is named by its URL; drop the uuid",
                    param=f"{where}.uuid",
                )
            return reference
        if url and self.remote is not None and self.remote.takes(url):
            # Fetched only where the operator opted in, then decoded like sent bytes (not an image: a 400).
            if self.fetching is None:
                self.fetching = FetchDeadline(self.remote.timeout_s, client_stop())
            image = self._decode_admitted(self.remote.fetch(url, where, self.fetching), where, f"{where}.image_url")
            if uuid is not None:
                self.used.append((uuid, image))
            return image
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
        # This request's own pixels under the uuid come first (they are what the uuid names from now on).
        sent = [item[1] for item in self.used if isinstance(item, tuple) and item[0] == uuid]
        image = sent[-1] if sent else self.uuids.lookup(self.namespace, uuid)
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
                f"{where}.image_url.url: remote URLs are not fetched (unless the server allows their domain: "
                f"--allowed-media-domains); send a data: URL, {REF_URL_PREFIX}<id>, "
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
                check_image_role(message, where)
                segments.append(resolver.image(part, where))
        turns.append((_ROLE[message.role], len(segments) - before))
    return segments, turns


def template_segments(messages: list[Message], marker: str) -> tuple[list[str], list[tuple[str, int]]]:
    """Messages as texts for a chat template (each image part the media ``marker``, nothing decoded) and their turns."""
    texts: list[str] = []
    turns: list[tuple[str, int]] = []
    for i, message in enumerate(messages):
        content = message.content
        parts = [content] if isinstance(content, str) else []
        for j, part in enumerate([] if isinstance(content, str) else content or []):
            if part.type != "text":
                check_image_role(message, f"messages[{i}].content[{j}]")  # chat's rule, one truth
            parts.append((part.text or "") if part.type == "text" else marker)
        texts += parts
        turns.append((_ROLE[message.role], len(parts)))
    return texts, turns


def check_image_role(message: Message, where: str) -> None:
    """400 for an image outside a user message (chat and ``/apply-template`` alike)."""
    if message.role != "user":
        raise ApiError(400, "unsupported", f"{where}: images are accepted in user messages only", param=where)


def own_origins(host: str, port: int, names: tuple[str, ...] = ()) -> frozenset[str]:
    """The ``host:port`` spellings that are this server: the bound address, loopback, and the names the
    operator gave. Never the request's ``Host``: a client could then make any URL name a reference."""
    spelled = {f"{host}:{port}", f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"}
    spelled.update(f"{name}:{port}" for name in names)
    return frozenset(n.lower() for n in spelled)


def _header_size(data: bytes) -> tuple[int, int]:
    """An image's size from its header alone (no pixel decoded); (0, 0) when unreadable: the decoder says why."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(io.BytesIO(data)) as img:
                return img.size
    except Exception:  # noqa: BLE001 -- any refusal is the decoder's to word
        return 0, 0


def prompt_end_of(messages: list[Message], add_generation_prompt: bool | None = None,
                  continue_final_message: bool | None = None) -> tuple[str, str]:
    """How a chat prompt ends (:data:`refsight.requests.PROMPT_ENDS`) and the field that asked, by
    llama-server's rules (vLLM's alike): a final assistant message is continued (llama-server's assistant prefill,
    its default); ``continue_final_message: true`` asks for that, and both servers want ``add_generation_prompt:
    false`` with it; else ``add_generation_prompt: false`` ends the prompt after the turns."""
    final_assistant = messages[-1].role == "assistant"
    if final_assistant and len(messages) >= 2 and messages[-2].role == "assistant":
        # llama-server's rule: the final assistant message is continued; two in a row have no meaning.
        raise ApiError(400, "invalid_input", "messages: cannot end with two assistant messages", param="messages")
    if continue_final_message:
        if add_generation_prompt is not False:
            raise ApiError(400, "invalid_input", "continue_final_message: cannot be true with add_generation_prompt "
                           "true; send add_generation_prompt: false", param="continue_final_message")
        if not final_assistant:
            raise ApiError(400, "invalid_input", "continue_final_message: the last message must be an assistant "
                           "message to continue", param="continue_final_message")
        return "continue", "continue_final_message"
    if final_assistant:
        return "continue", "messages"
    return ("none" if add_generation_prompt is False else "generation_prompt"), "add_generation_prompt"


def chat_prompt_end(service: Any, messages: list[Message], add_generation_prompt: bool | None = None,
                    continue_final_message: bool | None = None) -> str:
    """:func:`prompt_end_of` the messages; 400 naming the field that asked where the served backend cannot render it."""
    ending, asked_by = prompt_end_of(messages, add_generation_prompt, continue_final_message)
    if ending != "generation_prompt" and ending not in service.generation_support().prompt_ends:
        what = "continue a final assistant message" if ending == "continue" else "leave out the answer's opening"
        raise ApiError(400, "unsupported", f"{asked_by}: the served backend ({service.model}) cannot {what}",
                       param=asked_by)
    return ending
