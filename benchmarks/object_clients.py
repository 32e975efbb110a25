"""Which S3 client refsight's bucket store uses, by measurement: boto3, obstore, httpx + SigV4.

Against one throwaway SeaweedFS S3 server on loopback (as the tests start it), each client in a
process of its own (so its memory is its own) writes and reads objects of ``--mb`` megabytes
``--repeats`` times: one PUT (multipart in 8 MiB parts above 16 MiB, as refsight writes), and one
GET in parallel 8 MiB ranges (8 threads, or the client's own concurrency). Per client:

- ``put_mb_s`` / ``get_mb_s``: medians of the repeats, per size;
- ``rss_mb``: the process's peak resident memory after the runs (the bytes read are held once);
- ``import_ms``: what importing the client costs a command's start;
- ``async`` / ``multipart``: what the client offers (facts, not measured).

A client that is not installed is reported as such. Prints ONE JSON line.
Usage: ``python benchmarks/object_clients.py [--mb 4 64] [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PART = 8 * 1024 * 1024
CLIENTS = ("boto3", "obstore", "httpx_sigv4")
FACTS = {
    "boto3": {"async": False, "multipart": True, "profiles": True},
    "obstore": {"async": True, "multipart": True, "profiles": False},
    "httpx_sigv4": {"async": True, "multipart": False, "profiles": True},
}


def _ranges(size: int) -> list[tuple[int, int]]:
    return [(start, min(start + PART, size)) for start in range(0, size, PART)]


def _boto3(env: dict, bucket: str):
    from refsight.vllm_connector.refsight_objects import ObjectStore

    store = ObjectStore(f"s3://{bucket}/bench")
    return (lambda name, data: store.put(name, [data])), store.get


def _obstore(env: dict, bucket: str):
    import obstore
    from obstore.store import S3Store

    store = S3Store(bucket, endpoint=env["AWS_ENDPOINT_URL"], access_key_id=env["AWS_ACCESS_KEY_ID"],
                    secret_access_key=env["AWS_SECRET_ACCESS_KEY"], region="us-east-1",
                    virtual_hosted_style_request=False, client_options={"allow_http": True})

    def get(name: str) -> bytes:
        size = obstore.head(store, name)["size"]
        starts, ends = zip(*_ranges(size))
        return b"".join(bytes(part) for part in obstore.get_ranges(store, name, starts=list(starts), ends=list(ends)))

    return (lambda name, data: obstore.put(store, name, data, chunk_size=PART)), get


def _httpx(env: dict, bucket: str):
    from concurrent.futures import ThreadPoolExecutor

    import httpx
    from botocore.auth import S3SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    credentials = Credentials(env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"])
    client = httpx.Client(timeout=10, limits=httpx.Limits(max_connections=16))
    pool = ThreadPoolExecutor(8)
    base = f"{env['AWS_ENDPOINT_URL']}/{bucket}/"

    def send(method: str, name: str, data: bytes = b"", headers: dict | None = None) -> httpx.Response:
        request = AWSRequest(method=method, url=base + name, data=data, headers=headers or {})
        request.headers["x-amz-content-sha256"] = "UNSIGNED-PAYLOAD"
        S3SigV4Auth(credentials, "s3", "us-east-1").add_auth(request)
        response = client.request(method, base + name, content=data or None, headers=dict(request.headers))
        response.raise_for_status()
        return response

    def get(name: str) -> bytes:
        size = int(send("HEAD", name).headers["content-length"])
        parts = pool.map(lambda r: send("GET", name, headers={"Range": f"bytes={r[0]}-{r[1] - 1}"}).content, _ranges(size))
        return b"".join(parts)

    return (lambda name, data: send("PUT", name, data)), get


def _run_one(client: str, sizes: list[int], repeats: int, bucket: str) -> dict:
    """In this process: one client's figures."""
    import resource

    env = dict(os.environ)
    started = time.perf_counter()
    put, get = {"boto3": _boto3, "obstore": _obstore, "httpx_sigv4": _httpx}[client](env, bucket)
    figures = {"import_ms": round((time.perf_counter() - started) * 1000, 1), **FACTS[client]}
    for mb in sizes:
        data = os.urandom(mb * 1024 * 1024)
        puts, gets = [], []
        put(f"{client}/{mb}/warm", data)  # connections opened, code paths warm: not measured
        get(f"{client}/{mb}/warm")
        for i in range(repeats):
            name = f"{client}/{mb}/{i}"
            t0 = time.perf_counter()
            put(name, data)
            t1 = time.perf_counter()
            back = get(name)
            t2 = time.perf_counter()
            assert len(back) == len(data) and back[:64] == data[:64] and back[-64:] == data[-64:], client
            del back
            puts.append(t1 - t0)
            gets.append(t2 - t1)
        figures[f"put_mb_s_{mb}mb"] = round(mb * 1.048576 / statistics.median(puts), 1)
        figures[f"get_mb_s_{mb}mb"] = round(mb * 1.048576 / statistics.median(gets), 1)
    figures["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[4, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", choices=CLIENTS, help=argparse.SUPPRESS)  # the child's role
    parser.add_argument("--bucket", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(_run_one(args.one, args.mb, args.repeats, args.bucket)))
        return 0
    sys.path.insert(0, str(ROOT / "tests"))
    from services import S3Server

    server = S3Server()
    results: dict = {"mb": args.mb, "repeats": args.repeats, "cpu_count": os.cpu_count()}
    try:
        bucket = server.bucket().removeprefix("s3://").split("/")[0]
        env = {**os.environ, **server.env, "PYTHONPATH": os.pathsep.join(
            [str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])}
        for client in CLIENTS:
            child = subprocess.run(
                [sys.executable, __file__, "--one", client, "--bucket", bucket, "--repeats", str(args.repeats),
                 "--mb", *map(str, args.mb)], env=env, capture_output=True, text=True, timeout=600)
            lines = child.stdout.strip().splitlines()
            results[client] = json.loads(lines[-1]) if child.returncode == 0 and lines else {
                "error": (child.stderr.strip().splitlines() or ["failed"])[-1][:200]}
    finally:
        server.close()
    print(json.dumps(results), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
