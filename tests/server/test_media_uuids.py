"""The uuid memory itself: per tenant, bound to pixels, bounded in bytes (LRU), honest about what it kept."""

from __future__ import annotations

from live_server import photo_png
from refsight.inputs.images import load_image
from refsight.server.intake.media_uuids import ENTRY_OVERHEAD, MediaUuids


def test_entries_are_per_tenant_bound_to_pixels_and_bounded():
    cat, flipped = load_image(photo_png()), load_image(photo_png(flip=True))
    cost = 64 * 48 * 3 + len(cat.source_bytes) + ENTRY_OVERHEAD + 2 + 64  # pixels, bytes, overhead, key, hash
    uuids = MediaUuids(max_bytes=int(cost * 2.5))
    assert uuids.remember("a", "x", cat).outcome == "stored"
    assert uuids.lookup("b", "x") is None  # another tenant's uuid is a miss
    assert uuids.remember("a", "x", load_image(photo_png())).outcome == "unchanged"
    assert uuids.remember("a", "x", flipped).outcome == "replaced" and uuids.lookup("a", "x").sha256 == flipped.sha256
    uuids.remember("a", "y", cat)
    uuids.lookup("a", "x")  # x is now the most recently used
    uuids.remember("a", "z", cat)  # over the budget: the least recently used (y) goes
    assert uuids.lookup("a", "y") is None and uuids.lookup("a", "x") is not None and len(uuids) == 2
    assert MediaUuids(max_bytes=10).remember("a", "big", cat).outcome == "not_kept"


def test_entries_cost_their_overhead_and_are_capped_in_number():
    """Issue 38: 800,000 tiny entries under 256-character uuids were "55 MiB" by the old count and
    1.3 GB of RSS; each entry now costs its real overhead and their number is capped."""
    tiny = load_image(photo_png())
    uuids = MediaUuids(max_bytes=1 << 40, max_entries=50)
    for i in range(200):
        uuids.remember("tenant", f"{i:0>256}", tiny)
    assert len(uuids) == 50 and uuids.lookup("tenant", f"{199:0>256}") is not None
    assert uuids.bytes >= 50 * (ENTRY_OVERHEAD + 256 + 64*48*3)
