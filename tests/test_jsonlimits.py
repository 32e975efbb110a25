"""The one pass that measures JSON text before anything parses it, and the one decoding of JSON bytes
(issue 49, items 5 and 6): exact on any text, across chunk boundaries, at a few MiB whatever the text."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from refsight.errors import InvalidInputError
from refsight.inputs import jsonlimits
from refsight.inputs.jsonlimits import json_depth, json_nodes, json_shape, json_utf8, load_json


def _reference_shape(data: bytes) -> tuple[int, int]:
    """Byte by byte, as a parser reads it: escapes inside strings, brackets and commas outside."""
    depth = deepest = 0
    values, inside, escaped = 1, False, False
    for byte in data:
        if inside:
            escaped, inside = (False, inside) if escaped else (byte == 0x5C, byte != 0x22)
            continue
        if byte == 0x22:
            inside = True
        elif byte in b"[{":
            depth += 1
            deepest, values = max(deepest, depth), values + 1
        elif byte in b"]}":
            depth -= 1
        elif byte == 0x2C:
            values += 1
    return deepest, values


def _texts(seed: int, count: int) -> list[bytes]:
    """Random JSON-ish texts whose backslashes all lie inside strings (as in any valid JSON text)."""
    rng = random.Random(seed)
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(0, 12)):
            if rng.random() < 0.4:
                body = "".join(rng.choice(['\\"', "\\\\", "a", "[", "}", ",", '\\u00e9', "é"]) for _ in range(rng.randint(0, 6)))
                parts.append(f'"{body}"')
            else:
                parts.append(rng.choice(["[", "]", "{", "}", ",", " ", "1", "null"]))
        texts.append("".join(parts).encode())
    return texts


def test_the_scan_matches_a_byte_by_byte_reading_across_every_chunk_boundary(monkeypatch):
    monkeypatch.setattr(jsonlimits, "_CHUNK", 5)  # every escape run and string crosses a chunk boundary somewhere
    for text in _texts(seed=49, count=3000):
        assert json_shape(text) == _reference_shape(text), text
    backslashes = b'["' + b"\\" * 12 + b'", "' + b"\\" * 11 + b'"", [1]]'  # even runs end strings; an odd run escapes
    assert json_shape(backslashes) == _reference_shape(backslashes)
    real = json.dumps({"a": ['x\\"]' * 3, [[{"b": "\\\\["}]]], "c": "\\" * 7 + "{"}).encode()
    assert json_shape(real) == _reference_shape(real) == (5, 8)


def test_depth_and_values_are_measured_outside_strings_and_stop_early():
    assert json_depth('{"a": "[[[[", "b": [[1]]}') == 3
    assert json_depth(b"[" * 1000 + b"]" * 1000, stop_above=64) > 64
    assert json_nodes('{"a": [1, 2], "b": "x,[{"}') == 5
    assert json_shape(b"[" + b"[]," * 100 + b"[]]", max_values=10)[1] > 10


def _status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) / 1024
    raise AssertionError(key)


def test_a_body_of_escapes_costs_no_memory_per_escape():
    """31 MiB of \\" escapes: the old scan built a Python object per escape (1.4 GB); this one a few MiB."""
    escapes = b'{"prompt":"' + b'\\"' * ((31 << 20) // 2) + b'"}'
    brackets = b"[" * (1 << 24) + b"]" * (1 << 24)
    Path("/proc/self/clear_refs").write_text("5")  # the peak starts again from here
    before = _status_mb("VmRSS:")
    assert json_shape(escapes) == (1, 2)
    assert json_shape(brackets, max_depth=64)[0] > 64
    risen = _status_mb("VmHWM:") - before
    assert risen < 64, f"the scan raised peak memory by {risen:.0f} MB"


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"])
def test_every_encoding_the_json_rfcs_allow_is_read_as_utf8(encoding):
    text = json.dumps({"content": "héllo \U0001f600 [x]"}, ensure_ascii=False)
    assert json_utf8(text.encode(encoding), "body") == text.encode("utf-8")
    assert load_json(text.encode(encoding), "body") == {"content": "héllo \U0001f600 [x]"}


@pytest.mark.parametrize(("data", "reason"), [
    (b'{"a": "\xed\xa0\x80"}', "not valid UTF-8 (byte 0xed at offset 7"),  # a raw encoded lone surrogate
    (b'{"a": "\xff"}', "not valid UTF-8 (byte 0xff at offset 7"),
    ('{"a": "\ud800"}'.encode("utf-16-le", "surrogatepass"), "not valid UTF-16-LE"),
    ('{"a": "\ud800"}'.encode("utf-32-be", "surrogatepass"), "not valid UTF-32-BE"),
])
def test_bytes_that_do_not_decode_strictly_are_refused_naming_the_input(data, reason):
    with pytest.raises(InvalidInputError) as e:
        json_utf8(data, "request body")
    assert e.value.input == "request body" and e.value.reason.startswith(reason), e.value.reason
    with pytest.raises(InvalidInputError, match="not valid UTF"):
        load_json(data, "config.json")
