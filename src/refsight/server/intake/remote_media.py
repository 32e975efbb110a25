"""Images by URL, opt-in: vLLM's ``--allowed-media-domains`` for ``http(s)``, llama-server's
``--media-path`` for ``file://``.

By default nothing is fetched (the server makes no request on a client's behalf). When the
operator opts in, every URL must pass the checks below, each a 400 naming the image part:

- ``http(s)``: the host is exactly one of the allowed domain names (case-insensitive), or an IP
  address the list names, written in its canonical form (``--allowed-media-domains 10.0.0.7``
  fetches ``http://10.0.0.7/...``, as vLLM does). No user info (``http://allowed@evil``), no
  other numeric host in any spelling (``127.0.0.1`` unlisted, ``2130706433``, ``0x7f.1``,
  ``[::1]``): an allow-list of names cannot be dodged by addresses. Redirects are followed by hand, at most :data:`MAX_REDIRECTS`, each target
  checked by the same rules (a redirect off the list is refused). Proxies from the
  environment are not used. The name is resolved once, here, and the connection goes to that
  address (a second lookup could answer otherwise: DNS rebinding), with the name in ``Host``
  and TLS's SNI; an address that is not globally routable (loopback, private, link-local,
  carrier-grade NAT, reserved, IPv4-mapped forms of those) is used only when the allow-list
  names it as an IP (``--allowed-media-domains images.lan 10.0.0.7``), so a public name that
  resolves inward cannot reach the server's own network. The standard library's
  ``http.client`` speaks HTTP/1.1 over a socket this module opens, so nothing decodes a body
  behind its back. One deadline (:mod:`.fetch_deadline`) bounds DNS, connect, TLS, headers and
  body of all the images of a request together (``timeout_s``), and ends with the request when
  its client leaves: a server trickling its headers cannot hold a worker. The body's content
  encodings (``gzip``, ``deflate``, at most two layers; others refused by name) are undone a piece
  at a time (:mod:`.content_encodings`), both the bytes on the wire and the decoded bytes counted
  against ``max_bytes`` as they come: a decompression bomb stops at the cap.
- ``file://``: a regular file under the media directory, after symlinks are resolved (no
  ``..`` or link leads out), at most ``max_bytes``.

What comes back is decoded as an image by the caller, under the request's image and pixel
limits, so a page or a script that slipped through is refused as "not an image".
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import ipaddress
import os
import re
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import SplitResult, quote, unquote, urljoin, urlsplit

from .content_encodings import PIECE, EncodingError, decoded, encoding_layers
from ..edge.disconnect import ClientGone
from ..edge.http_errors import ApiError
from .fetch_deadline import FetchDeadline, FetchStopped

__all__ = ["RemoteMedia", "MAX_REDIRECTS"]

#: Redirects one image URL may take.
MAX_REDIRECTS = 3
#: A host whose labels are all numbers (decimal, octal or 0x-hex) is an address in one of inet_aton's spellings.
_NUMERIC = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+))*\.?", re.IGNORECASE)
_REDIRECTS = {301, 302, 303, 307, 308}
#: The characters of a URL's path and query sent as they are (RFC 3986's reserved and unreserved ones, and ``%``).
_URL_SAFE = "/%:@!$&'()*+,;=~"


@dataclass(frozen=True)
class RemoteMedia:
    """The operator's opt-in to images by URL and the limits on fetching them."""

    allowed_domains: tuple[str, ...] = ()
    media_path: str | os.PathLike | None = None
    max_bytes: int = 20 * 1024 * 1024
    #: Seconds for every fetch of one request together (see :class:`~.fetch_deadline.FetchDeadline`).
    timeout_s: float = 10.0

    def takes(self, url: str) -> bool:
        """Whether ``url`` is a kind this server was told to fetch (else it is refused as before)."""
        if url.startswith(("http://", "https://")):
            return bool(self.allowed_domains)
        return url.startswith("file://") and self.media_path is not None

    def fetch(self, url: str, where: str, deadline: FetchDeadline | None = None) -> bytes:
        """The bytes ``url`` names, under every check of the module; 400 naming ``where`` otherwise.

        ``deadline``: the request's, shared by all its fetches (None: ``timeout_s`` for this fetch alone).
        """
        if url.startswith("file://"):
            return self._file(url, where)
        return self._http(url, where, deadline or FetchDeadline(self.timeout_s))

    def _refuse(self, where: str, why: str, code: str = "media_not_allowed", url: str | None = None) -> ApiError:
        """A 400 naming the image part and the URL (after any redirect): ``media_not_allowed`` (a rule),
        ``media_unavailable`` (the fetch failed)."""
        named = f" ({url[:200]})" if url else ""
        return ApiError(400, code, f"{where}.image_url.url{named}: {why}", param=where)

    def _check_http(self, url: str, where: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise self._refuse(where, f"{parts.scheme or 'no'} scheme: only http(s) URLs are fetched", url=url)
        if "@" in parts.netloc or parts.username is not None:
            raise self._refuse(where, "a URL with user info is not fetched", url=url)
        host = (parts.hostname or "").rstrip(".").lower()
        if host and self._named_address(host):
            pass  # an address the operator named, in its canonical spelling (vLLM fetches it too)
        elif not host or ":" in host or "[" in parts.netloc or _NUMERIC.fullmatch(host):
            raise self._refuse(where, "a numeric or IPv6 host is not fetched: name an allowed domain "
                               "(or the address itself in --allowed-media-domains)", url=url)
        try:
            parts.port  # noqa: B018 -- raises for a port that is not a number
        except ValueError:
            raise self._refuse(where, "the port is not a number", url=url) from None
        if not self._named_address(host) and host not in {d.rstrip(".").lower() for d in self.allowed_domains}:
            raise self._refuse(where, f"{host} is not an allowed media domain (--allowed-media-domains)", url=url)

    def _named_address(self, host: str) -> bool:
        """Whether ``host`` is an IP address written exactly as one the allow-list names (``127.0.0.1``, ``::1``):
        no other spelling of a number (``2130706433``, ``0x7f.1``) ever passes."""
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return str(address) == host and address in self._named_ips()

    def _named_ips(self) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
        """The IP addresses the allow-list names."""
        named = set()
        for entry in self.allowed_domains:
            try:
                named.add(ipaddress.ip_address(entry.strip("[]")))
            except ValueError:
                pass  # a domain name
        return named

    def _address(self, host: str, port: int, where: str, url: str, deadline: FetchDeadline) -> str:
        """The one address ``host`` is fetched from: the first it resolves to that is globally routable or
        named in the allow-list as an IP; 400 when none is."""
        try:
            found = deadline.resolve(host, port)
        except OSError:
            raise self._refuse(where, f"{host} does not resolve", "media_unavailable", url) from None
        named = self._named_ips()
        addresses = []
        for *_, sockaddr in found:
            address = ipaddress.ip_address(sockaddr[0].split("%")[0])
            address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:10.0.0.1 is 10.0.0.1
            if address.is_global or address in named:
                return str(address)
            addresses.append(str(address))
        raise self._refuse(where, f"{host} resolves to {', '.join(addresses)}, not a public address "
                           "(name the address in --allowed-media-domains to allow it)", url=url)

    def _http(self, url: str, where: str, deadline: FetchDeadline) -> bytes:
        for _ in range(MAX_REDIRECTS + 1):
            self._check_http(url, where)
            parts = urlsplit(url)
            port = parts.port or (443 if parts.scheme == "https" else 80)
            try:
                address = self._address(parts.hostname or "", port, where, url, deadline)
                with self._connection(parts, address, port, deadline) as sock:
                    response = _get(sock, parts)
                    location = response.getheader("location")
                    if response.status in _REDIRECTS and location:
                        url = urljoin(url, location)
                        continue
                    if response.status != 200:
                        raise self._refuse(where, f"the server answered {response.status}", "media_unavailable", url)
                    return self._read(response, where, url, deadline)
            except FetchStopped as e:
                raise self._stopped(e, where, url) from None
            except (OSError, http.client.HTTPException, ValueError) as e:
                # A read the watchdog cut short fails as a closed connection: then the deadline is the reason.
                stopped = deadline.stopped()
                if stopped is not None:
                    raise self._stopped(stopped, where, url) from None
                raise self._refuse(where, f"cannot be fetched ({type(e).__name__})", "media_unavailable", url) from None
        raise self._refuse(where, f"more than {MAX_REDIRECTS} redirects", url=url)

    @contextlib.contextmanager
    def _connection(self, parts: SplitResult, address: str, port: int, deadline: FetchDeadline) -> Iterator[socket.socket]:
        """A socket to ``address`` (TLS checked against the URL's name for https) under ``deadline``'s watchdog."""
        with contextlib.closing(deadline.connect(address, port)) as raw, deadline.guard(raw):
            if parts.scheme != "https":
                yield raw
                return
            # The name, not the address dialled, is what TLS checks the certificate against (SNI).
            with _tls().wrap_socket(raw, server_hostname=parts.hostname) as sock:
                yield sock

    def _stopped(self, reason: FetchStopped, where: str, url: str) -> ApiError:
        """The error of a fetch that its client (a 499 nobody reads) or its deadline ended."""
        if reason.client_left:
            return ClientGone()
        return self._refuse(
            where, f"took more than {self.timeout_s:g} s (DNS, connect, headers and body of the request's images "
            "in all)", "media_unavailable", url,
        )

    def _read(self, response: http.client.HTTPResponse, where: str, url: str, deadline: FetchDeadline) -> bytes:
        """The body, its content encodings undone a piece at a time and the decoded bytes counted against
        ``max_bytes`` as they come (a bomb stops at the cap, never decoded whole)."""
        self._check_head(response, where, url)
        data = bytearray()
        try:
            layers = encoding_layers(response.msg.get_all("content-encoding") or ())
            for piece in decoded(self._raw(response, where, url), layers):
                data += piece
                if len(data) > self.max_bytes:
                    raise self._refuse(where, f"larger than {self.max_bytes} bytes (decoded)", url=url)
                deadline.check()
        except EncodingError as e:
            deadline.check()  # a body the watchdog cut is late, not badly encoded
            raise self._refuse(where, str(e), "media_unavailable", url) from None
        deadline.check()
        if response.length:  # what Content-Length promised beyond what came
            raise self._refuse(where, "the connection closed before the end of the body", "media_unavailable", url)
        return bytes(data)

    def _check_head(self, response: http.client.HTTPResponse, where: str, url: str) -> None:
        declared = response.getheader("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise self._refuse(where, f"larger than {self.max_bytes} bytes", url=url)
        kind = (response.getheader("content-type") or "").split(";")[0].strip().lower()
        if kind and not (kind.startswith("image/") or kind == "application/octet-stream"):
            raise self._refuse(where, f"Content-Type {kind!r} is not an image", url=url)
        transfer = (response.getheader("transfer-encoding") or "chunked").strip().lower()
        if transfer != "chunked":
            raise self._refuse(where, f"Transfer-Encoding {transfer!r} is not supported", "media_unavailable", url)

    def _raw(self, response: http.client.HTTPResponse, where: str, url: str) -> Iterator[bytes]:
        """The body as it arrives on the wire, at most ``max_bytes`` of it."""
        received = 0
        while piece := response.read1(PIECE):
            received += len(piece)
            if received > self.max_bytes:
                raise self._refuse(where, f"larger than {self.max_bytes} bytes", url=url)
            yield piece

    def _file(self, url: str, where: str) -> bytes:
        root = Path(self.media_path).resolve()
        # As llama-server reads it: what follows file:// is a path relative to the media directory.
        relative = unquote(url[len("file://"):]).lstrip("/")
        if "\0" in relative:
            raise self._refuse(where, "not a path")
        # Relative to the media directory (as llama-server's --media-path), never an absolute path elsewhere.
        path = (root / relative).resolve()
        if root != path and root not in path.parents:
            raise self._refuse(where, "the file is outside the media directory (--media-path)")
        if not path.is_file():  # before opening: a FIFO or a device would block or never end
            raise self._refuse(where, "no such regular file in the media directory")
        try:
            with open(path, "rb") as f:
                data = f.read(self.max_bytes + 1)
        except OSError:
            raise self._refuse(where, "no such file in the media directory") from None
        if len(data) > self.max_bytes:
            raise self._refuse(where, f"larger than {self.max_bytes} bytes")
        return data


def _get(sock: socket.socket, parts: SplitResult) -> http.client.HTTPResponse:
    """The response (status and headers read, body not) to ``GET`` of ``parts`` sent over ``sock``."""
    connection = http.client.HTTPConnection(parts.hostname or "", parts.port)
    connection.sock = sock  # connected and guarded by the caller: http.client only speaks HTTP on it
    # As a browser sends it: what is not ASCII (or a space) percent-encoded, escapes already there kept.
    target = quote(parts.path or "/", safe=_URL_SAFE)
    if parts.query:
        target += "?" + quote(parts.query, safe=_URL_SAFE + "?")
    connection.request("GET", target, headers={
        "Host": parts.netloc, "Accept": "image/*", "Accept-Encoding": "gzip, deflate", "Connection": "close",
        "User-Agent": "refsight",
    })
    return connection.getresponse()


@functools.cache
def _tls() -> ssl.SSLContext:
    """The system's certificate authorities, host names checked: one context for every fetch."""
    return ssl.create_default_context()
