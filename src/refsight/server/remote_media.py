"""Images by URL, opt-in: vLLM's ``--allowed-media-domains`` for ``http(s)``, llama-server's
``--media-path`` for ``file://``.

By default nothing is fetched (the server makes no request on a client's behalf). When the
operator opts in, every URL must pass the checks below, each a 400 naming the image part:

- ``http(s)``: the host is exactly one of the allowed domain names (case-insensitive). No
  user info (``http://allowed@evil``), no numeric host in any spelling (``127.0.0.1``,
  ``2130706433``, ``0x7f.1``, ``[::1]``): an allow-list of names cannot be dodged by
  addresses. Redirects are followed by hand, at most :data:`MAX_REDIRECTS`, each target
  checked by the same rules (a redirect off the list is refused). Proxies from the
  environment are not used. The name is resolved once, here, and the connection goes to that
  address (a second lookup could answer otherwise: DNS rebinding), with the name in ``Host``
  and TLS's SNI; an address that is not globally routable (loopback, private, link-local,
  carrier-grade NAT, reserved, IPv4-mapped forms of those) is used only when the allow-list
  names it as an IP (``--allowed-media-domains images.lan 10.0.0.7``), so a public name that
  resolves inward cannot reach the server's own network. The body is read in pieces and
  abandoned past ``max_bytes`` or past ``timeout_s`` in all (a slow trickle cannot hold a worker).
- ``file://``: a regular file under the media directory, after symlinks are resolved (no
  ``..`` or link leads out), at most ``max_bytes``.

What comes back is decoded as an image by the caller, under the request's image and pixel
limits, so a page or a script that slipped through is refused as "not an image".
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urljoin, urlsplit

from .errors import ApiError

__all__ = ["RemoteMedia", "MAX_REDIRECTS"]

#: Redirects one image URL may take.
MAX_REDIRECTS = 3
#: A host whose labels are all numbers (decimal, octal or 0x-hex) is an address in one of inet_aton's spellings.
_NUMERIC = re.compile(r"(0x[0-9a-f]*|[0-9]+)(\.(0x[0-9a-f]*|[0-9]+))*\.?", re.IGNORECASE)
_REDIRECTS = {301, 302, 303, 307, 308}


@dataclass(frozen=True)
class RemoteMedia:
    """The operator's opt-in to images by URL and the limits on fetching them."""

    allowed_domains: tuple[str, ...] = ()
    media_path: str | os.PathLike | None = None
    max_bytes: int = 20 * 1024 * 1024
    timeout_s: float = 10.0

    def takes(self, url: str) -> bool:
        """Whether ``url`` is a kind this server was told to fetch (else it is refused as before)."""
        if url.startswith(("http://", "https://")):
            return bool(self.allowed_domains)
        return url.startswith("file://") and self.media_path is not None

    def fetch(self, url: str, where: str) -> bytes:
        """The bytes ``url`` names, under every check of the module; 400 naming ``where`` otherwise."""
        if url.startswith("file://"):
            return self._file(url, where)
        return self._http(url, where)

    def _refuse(self, where: str, why: str, code: str = "media_not_allowed") -> ApiError:
        """A 400 naming the image part: ``media_not_allowed`` (a rule), ``media_unavailable`` (the fetch failed)."""
        return ApiError(400, code, f"{where}.image_url.url: {why}", param=where)

    def _check_http(self, url: str, where: str) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https"):
            raise self._refuse(where, f"{parts.scheme or 'no'} scheme: only http(s) URLs are fetched")
        if "@" in parts.netloc or parts.username is not None:
            raise self._refuse(where, "a URL with user info is not fetched")
        host = (parts.hostname or "").rstrip(".").lower()
        if not host or ":" in host or "[" in parts.netloc or _NUMERIC.fullmatch(host):
            raise self._refuse(where, "a numeric or IPv6 host is not fetched: name an allowed domain")
        try:
            parts.port  # noqa: B018 -- raises for a port that is not a number
        except ValueError:
            raise self._refuse(where, "the port is not a number") from None
        if host not in {d.rstrip(".").lower() for d in self.allowed_domains}:
            raise self._refuse(where, f"{host} is not an allowed media domain (--allowed-media-domains)")

    def _address(self, host: str, port: int, where: str) -> str:
        """The one address ``host`` is fetched from: the first it resolves to that is globally routable or
        named in the allow-list as an IP; 400 when none is."""
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            raise self._refuse(where, f"{host} does not resolve", "media_unavailable") from None
        named = set()
        for entry in self.allowed_domains:
            try:
                named.add(ipaddress.ip_address(entry.strip("[]")))
            except ValueError:
                pass  # a domain name
        addresses = []
        for *_, sockaddr in found:
            address = ipaddress.ip_address(sockaddr[0].split("%")[0])
            address = getattr(address, "ipv4_mapped", None) or address  # ::ffff:10.0.0.1 is 10.0.0.1
            if address.is_global or address in named:
                return str(address)
            addresses.append(str(address))
        raise self._refuse(where, f"{host} resolves to {', '.join(addresses)}, not a public address "
                           "(name the address in --allowed-media-domains to allow it)")

    def _pinned(self, url: str, where: str) -> tuple[str, dict[str, str], dict[str, Any]]:
        """(URL with the resolved address as its host, headers, httpx extensions) of a checked ``url``."""
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = self._address(parts.hostname or "", port, where)
        netloc = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        # The name stays what the server sees (Host) and what TLS checks the certificate against (SNI).
        extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
        return parts._replace(netloc=netloc).geturl(), {"Accept": "image/*", "Host": parts.netloc}, extensions

    def _http(self, url: str, where: str) -> bytes:
        import httpx

        deadline = time.monotonic() + self.timeout_s
        with httpx.Client(follow_redirects=False, trust_env=False, timeout=self.timeout_s) as client:
            for _ in range(MAX_REDIRECTS + 1):
                self._check_http(url, where)
                target, headers, extensions = self._pinned(url, where)
                try:
                    with client.stream("GET", target, headers=headers, extensions=extensions) as response:
                        if response.status_code in _REDIRECTS and "location" in response.headers:
                            url = urljoin(url, response.headers["location"])
                            continue
                        if response.status_code != 200:
                            raise self._refuse(where, f"the server answered {response.status_code}", "media_unavailable")
                        return self._read(response, where, deadline)
                except httpx.HTTPError as e:
                    raise self._refuse(where, f"cannot be fetched ({type(e).__name__})", "media_unavailable") from None
        raise self._refuse(where, f"more than {MAX_REDIRECTS} redirects")

    def _read(self, response, where: str, deadline: float) -> bytes:
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            raise self._refuse(where, f"larger than {self.max_bytes} bytes")
        kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
        if kind and not (kind.startswith("image/") or kind == "application/octet-stream"):
            raise self._refuse(where, f"Content-Type {kind!r} is not an image")
        data = bytearray()
        for piece in response.iter_bytes():
            data += piece
            if len(data) > self.max_bytes:
                raise self._refuse(where, f"larger than {self.max_bytes} bytes")
            if time.monotonic() > deadline:
                raise self._refuse(where, f"took more than {self.timeout_s:g} s", "media_unavailable")
        return bytes(data)

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
