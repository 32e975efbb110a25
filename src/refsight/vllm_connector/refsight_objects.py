"""An S3-compatible bucket, as refsight's stores use it: whole objects up and down, fast, never a hang.

Self-contained on purpose (boto3, the standard library and its sibling :mod:`refsight_breaker`):
refsight's store reads and writes its packages, kept images and prefix states through it, and
refsight's vLLM connector its encoder outputs, inside vLLM's own environment (where refsight is
not installed), as a top-level module next to :mod:`refsight_ec_store`. So it imports the breaker
relatively inside refsight's package and as a top-level module inside vLLM (``__package__`` says which).

Configured as every S3 tool is: ``AWS_ENDPOINT_URL`` (or ``AWS_ENDPOINT_URL_S3``; unset: AWS),
``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (or ``AWS_PROFILE`` and the profiles of
``~/.aws/config``, instance roles ...), ``AWS_REGION``. A custom endpoint (SeaweedFS, MinIO,
Ceph RGW) is addressed path-style unless its profile says ``s3 = addressing_style = ...``.

- **Objects are written whole or not at all**: one PUT, or above :data:`MULTIPART_BYTES` a
  multipart upload whose parts go up in parallel and which is completed (atomically) or
  aborted; a writer killed mid-upload leaves an incomplete upload, never an object.
- **Large objects come down in parallel ranges** of :data:`PART_BYTES` into one buffer.
- **An outage costs one short timeout, then nothing** (as refsight's Redis tier, through the same
  :class:`refsight_breaker.Breaker`): no client retries; a failed or timed-out call, or a server
  error (5xx: a store restarting, or asking to slow down), starts a back-off (``min_backoff_s``,
  2 s, doubling to ``max_backoff_s``, 30 s) during which every call raises :class:`BucketUnavailable`
  at once, saying when the bucket is tried again (``retry_after``); then ONE call probes, and on
  success the bucket is used again. A write may wait longer for its
  answer (``write_timeout_s``: a server may first have to make room), so it first asks the bucket
  (a HEAD, with the reads' short timeout): a store that hangs costs a write a read's timeout too.
- **Configuration errors say which setting**: :meth:`ObjectStore.check` raises
  :class:`BucketConfigError` for refused credentials or a missing bucket, in one line.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import urlsplit

if __package__:  # refsight's store imports this module from its package
    from .refsight_breaker import Breaker
else:  # inside vLLM, a top-level module beside the breaker (this folder is on PYTHONPATH)
    from refsight_breaker import Breaker

__all__ = [
    "ObjectStore", "ObjectEntry", "BucketConfigError", "BucketUnavailable", "is_bucket_url", "PART_BYTES",
    "MULTIPART_BYTES",
]

log = logging.getLogger("refsight.store.bucket")

#: The size of one part of an upload and of one range of a download.
PART_BYTES = 8 * 1024 * 1024
#: Objects larger than this go up as a multipart upload.
MULTIPART_BYTES = 16 * 1024 * 1024
_SCHEME = "s3://"
# S3's error codes, by what they mean for the operator.
_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}
_NO_BUCKET = {"NoSuchBucket"}
_REFUSED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken"}


def is_bucket_url(value: object) -> bool:
    """Whether ``value`` names a bucket (``s3://BUCKET[/PREFIX]``) rather than a directory."""
    return isinstance(value, str) and value.startswith(_SCHEME)


class BucketConfigError(Exception):
    """The bucket cannot be used as configured (credentials refused, no such bucket): the message names the setting."""


class BucketUnavailable(Exception):
    """The object store did not answer (down, hanging, backing off): try again later (``retry_after`` seconds
    from now it is tried again); nothing is lost."""

    def __init__(self, message: str, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class ObjectEntry:
    """One object of a listing: its name under the store's prefix, size and last change (epoch seconds)."""

    name: str
    size: int
    modified: float


class ObjectStore:
    """Objects under ``s3://BUCKET/PREFIX``, by name; thread-safe (one client, a pool of connections)."""

    def __init__(
        self, url: str, *, timeout_s: float = 2.0, write_timeout_s: float = 15.0, connect_timeout_s: float = 1.0,
        min_backoff_s: float = 2.0, max_backoff_s: float = 30.0, workers: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bucket, self.prefix = _parse(url)
        self.url = f"{_SCHEME}{self.bucket}/{self.prefix}".rstrip("/")
        # Reads wait at most timeout_s for an answer; a write may wait longer (a server may first have to make
        # room: SeaweedFS grows a volume, a busy MinIO queues). A write asks the bucket first (put), so a store
        # that hangs costs it no more than a read.
        self._client, self.endpoint = _client(timeout_s, connect_timeout_s, workers)
        self._writer, _ = _client(write_timeout_s, connect_timeout_s, workers)
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="refsight-bucket")
        # The first back-off is as long as a read's timeout: the calls a request makes right after the one that
        # failed are skipped, not probes, so a request loses one timeout, not two (a retry after 0.5 s, as Redis's
        # 0.25 s timeout allows, would often fall inside the same request).
        self.breaker = Breaker(f"object store {self.url}", logger=log, min_backoff_s=min_backoff_s,
                               max_backoff_s=max_backoff_s, clock=clock)
        self._lock = threading.Lock()
        self.list_page = 1000  # keys per listing request (S3's largest page)
        self.counts = {"reads": 0, "bytes_read": 0, "writes": 0, "bytes_written": 0}

    # -- names -------------------------------------------------------------------------
    def key(self, name: str) -> str:
        """The object key of ``name`` (under the store's prefix)."""
        return f"{self.prefix}/{name}" if self.prefix else name

    # -- health --------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        """Whether the bucket is in use now (not backing off after a failure)."""
        return self.breaker.available

    def _unavailable(self, message: str) -> BucketUnavailable:
        return BucketUnavailable(message, self.breaker.retry_in())

    def _failed(self, exc: BaseException, doing: str) -> BucketUnavailable:
        self.breaker.failed(exc)
        return self._unavailable(f"object store {self.url} {doing}: {exc}")

    def _call(self, operation: Callable[[Any], Any], *, write: bool = False) -> Any:
        """``operation(client)``; raises BucketUnavailable when backing off or when the store fails to answer."""
        if not self.breaker.allow():
            raise self._unavailable(f"object store {self.url} is unavailable (backing off)")
        try:
            result = operation(self._writer if write else self._client)
        except Exception as exc:  # noqa: BLE001 - sorted below: a refusal is no outage, anything else is
            if _code(exc) is not None and not _server_error(exc):
                self.breaker.succeeded()  # the server answered (404, 403 ...): the caller decides what it means
                raise
            # No answer, or a server error (500 InternalError, 503 SlowDown: a store restarting, or overloaded)
            raise self._failed(exc, "failed") from exc
        self.breaker.succeeded()
        return result

    def _answers(self) -> None:
        """Return once the store answers a HEAD of the bucket within the reads' timeout (any answer will do)."""

        def head(client: Any) -> None:
            try:
                client.head_bucket(Bucket=self.bucket)
            except Exception as exc:  # noqa: BLE001 - a refusal is an answer too: the write that follows says more
                if _code(exc) is None:
                    raise

        self._call(head)

    # -- start ----------------------------------------------------------------------------
    def check(self) -> None:
        """Raise BucketConfigError (credentials, bucket) or BucketUnavailable (unreachable); None when usable."""
        try:
            self._call(lambda c: c.head_bucket(Bucket=self.bucket))
        except BucketUnavailable as exc:
            raise self._unavailable(f"cannot reach the object store at {self.endpoint} (AWS_ENDPOINT_URL): "
                                    f"{exc.__cause__ or exc}") from None
        except Exception as exc:  # noqa: BLE001 - an answer of the server: say which setting it refused
            raise BucketConfigError(self._config_problem(exc)) from None

    def _config_problem(self, exc: BaseException) -> str:
        code = _code(exc)
        if code in _NOT_FOUND or code in _NO_BUCKET:
            return f"bucket {self.bucket!r} does not exist at {self.endpoint} (--store {self.url}); create it first"
        if code in _REFUSED:
            return (f"the object store at {self.endpoint} refused the credentials for bucket {self.bucket!r} ({code}): "
                    "check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or AWS_PROFILE)")
        return f"the object store at {self.endpoint} refused bucket {self.bucket!r}: {code}"

    # -- objects ----------------------------------------------------------------------------
    def get(self, name: str) -> bytearray | None:
        """The object's bytes (a writable buffer), None when there is none; large ones in parallel ranges."""
        key = self.key(name)
        try:
            first = self._call(lambda c: c.get_object(Bucket=self.bucket, Key=key, Range=f"bytes=0-{PART_BYTES - 1}"))
        except BucketUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in _NOT_FOUND or _code(exc) == "InvalidRange":  # InvalidRange: an empty object
                return None
            raise self._unavailable(f"object store {self.url}: cannot read {name}: {_code(exc)}") from exc
        total = _total_size(first)
        buffer = bytearray(total)  # every part is read straight into it: no copy of the bytes
        view = memoryview(buffer)
        head = min(total, PART_BYTES)
        self._body(first, view[:head], key)
        ranges = [(start, min(start + PART_BYTES, total)) for start in range(head, total, PART_BYTES)]
        for _ in self._pool.map(lambda r: self._range(key, view, *r), ranges):
            pass
        self._tally("reads", "bytes_read", total)
        return buffer

    def _range(self, key: str, view: memoryview, start: int, end: int) -> None:
        answer = self._call(lambda c: c.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end - 1}"))
        self._body(answer, view[start:end], key)

    def _body(self, answer: dict, into: memoryview, key: str) -> None:
        """Read the answer's body into ``into``, which it must fill exactly."""
        body = answer["Body"]
        got = 0
        try:
            while got < len(into):
                n = body.readinto(into[got:])
                if not n:
                    break
                got += n
            extra = body.read(1)
        except Exception as exc:  # noqa: BLE001 - a read timeout mid-body is an outage like any other
            raise self._failed(exc, "failed mid-read") from exc
        if got != len(into) or extra:
            raise self._unavailable(f"object store {self.url}: {key} changed while it was read")

    def put(self, name: str, chunks: Iterable[bytes | bytearray | memoryview]) -> int:
        """Write the object whole (multipart above :data:`MULTIPART_BYTES`); returns its size."""
        data = b"".join(chunks)
        key = self.key(name)
        self._answers()  # a store that hangs: found within the reads' timeout, not the write's
        if len(data) <= MULTIPART_BYTES:
            self._call(lambda c: c.put_object(Bucket=self.bucket, Key=key, Body=data), write=True)
        else:
            self._multipart(key, memoryview(data))
        self._tally("writes", "bytes_written", len(data))
        return len(data)

    def _multipart(self, key: str, data: memoryview) -> None:
        upload = self._call(lambda c: c.create_multipart_upload(Bucket=self.bucket, Key=key), write=True)["UploadId"]
        try:
            starts = range(0, len(data), PART_BYTES)
            parts = list(self._pool.map(lambda i: self._part(key, upload, i + 1, data[starts[i]:starts[i] + PART_BYTES]),
                                        range(len(starts))))
            self._call(lambda c: c.complete_multipart_upload(
                Bucket=self.bucket, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}), write=True)
        except BaseException:
            try:  # no object appears; what the server kept of the parts goes (or gc aborts it later)
                self._client.abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload)
            except Exception:  # noqa: BLE001 - the store may be down: gc aborts stale uploads
                pass
            raise

    def _part(self, key: str, upload: str, number: int, body: memoryview) -> dict:
        answer = self._call(lambda c: c.upload_part(
            Bucket=self.bucket, Key=key, UploadId=upload, PartNumber=number, Body=bytes(body)), write=True)
        return {"PartNumber": number, "ETag": answer["ETag"]}

    def exists(self, name: str) -> bool:
        """Whether an object ``name`` is there (a HEAD)."""
        try:
            self._call(lambda c: c.head_object(Bucket=self.bucket, Key=self.key(name)))
        except BucketUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001
            if _code(exc) in _NOT_FOUND:
                return False
            raise self._unavailable(f"object store {self.url}: cannot look at {name}: {_code(exc)}") from exc
        return True

    def delete(self, name: str) -> None:
        """Remove the object ``name`` (nothing when absent)."""
        self._call(lambda c: c.delete_object(Bucket=self.bucket, Key=self.key(name)))

    def listing(self, prefix: str = "") -> Iterator[ObjectEntry]:
        """Every object whose name starts with ``prefix``, in name order, a page (``list_page``) at a time."""
        start = self.key(prefix)
        strip = len(self.key(""))
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = self._call(lambda c: c.list_objects_v2(Bucket=self.bucket, Prefix=start, MaxKeys=self.list_page,
                                                          **extra))
            for item in page.get("Contents", ()):
                yield ObjectEntry(item["Key"][strip:], int(item["Size"]), item["LastModified"].timestamp())
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return

    def abort_stale_uploads(self, older_than_s: float) -> int:
        """Abort the multipart uploads started over ``older_than_s`` ago (killed writers'); returns how many."""
        cutoff = time.time() - older_than_s
        aborted = 0
        markers: dict[str, str] = {}
        while True:
            page = self._call(lambda c: c.list_multipart_uploads(Bucket=self.bucket, Prefix=self.key(""), **markers))
            for upload in page.get("Uploads", ()):
                if upload["Initiated"].timestamp() < cutoff:
                    self._call(lambda c, u=upload: c.abort_multipart_upload(
                        Bucket=self.bucket, Key=u["Key"], UploadId=u["UploadId"]))
                    aborted += 1
            if not page.get("IsTruncated"):
                return aborted
            markers = {"KeyMarker": page.get("NextKeyMarker", ""), "UploadIdMarker": page.get("NextUploadIdMarker", "")}

    def _tally(self, count: str, nbytes: str, size: int) -> None:
        with self._lock:
            self.counts[count] += 1
            self.counts[nbytes] += size

    def info(self) -> dict[str, Any]:
        """This process's figures (reads, writes, errors, skipped calls, outages) and the store's state."""
        with self._lock:
            counts = dict(self.counts)
        return {**counts, **self.breaker.info(), "url": self.url, "endpoint": self.endpoint}

    def close(self) -> None:
        """Stop the transfer threads and close the connections. Idempotent."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        for client in (self._client, self._writer):
            try:
                client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection must not fail a shutdown
                pass


def _parse(url: str) -> tuple[str, str]:
    if not is_bucket_url(url):
        raise BucketConfigError(f"a bucket is named s3://BUCKET/PREFIX, not {url!r}")
    parts = urlsplit(url)
    bucket, prefix = parts.netloc, parts.path.strip("/")
    if not 3 <= len(bucket) <= 63 or parts.query or parts.fragment:
        raise BucketConfigError(f"{url!r}: a bucket name has 3 to 63 characters, and the URL no query: s3://BUCKET/PREFIX")
    return bucket, prefix


def _client(timeout_s: float, connect_timeout_s: float, workers: int) -> tuple[Any, str]:
    """A boto3 S3 client from the environment and profiles, and the endpoint it talks to (for messages)."""
    import boto3
    from botocore.config import Config

    session = boto3.Session()
    scoped = session._session.get_scoped_config()  # the profile's own settings (its s3 addressing style)
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or scoped.get("endpoint_url")
    style = (scoped.get("s3") or {}).get("addressing_style") or ("path" if endpoint else "auto")
    config = Config(
        connect_timeout=connect_timeout_s, read_timeout=timeout_s, retries={"total_max_attempts": 1},
        max_pool_connections=workers * 2, s3={"addressing_style": style},
        # refsight checks every object itself (xxh3-128 and a header naming its key): no second checksum pass.
        request_checksum_calculation="when_required", response_checksum_validation="when_required",
    )
    client = session.client("s3", endpoint_url=endpoint or None, config=config)
    return client, endpoint or client.meta.endpoint_url


def _code(exc: BaseException) -> str | None:
    """The S3 error code of an answer the server gave (``NoSuchKey``, ``403`` ...), None for no answer."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return None
    return str(response.get("Error", {}).get("Code") or response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


def _server_error(exc: BaseException) -> bool:
    """Whether the server answered with a 5xx (it cannot serve now: an outage, as no answer is)."""
    response = getattr(exc, "response", None)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") if isinstance(response, dict) else None
    return isinstance(status, int) and status >= 500


def _total_size(answer: dict) -> int:
    content_range = answer.get("ContentRange")  # "bytes 0-8388607/12345678"
    if content_range and "/" in content_range:
        return int(content_range.rsplit("/", 1)[1])
    return int(answer["ContentLength"])
