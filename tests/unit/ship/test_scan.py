"""An archive read on its way to docker load (nodekit/ship/scan.py): the engine gets every byte but the end until the
archive was checked, and what two tar readers could read differently is refused."""

from __future__ import annotations

import gzip
import io
import random
import tarfile

import pytest

from nodekit.image.contents import BadArchive
from nodekit.ship.scan import HOLD, gunzipped, scan
from tests.factories import tar_of


def chunked(data: bytes, size: int = 64 << 10) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_the_engine_gets_nothing_past_the_last_member_before_release() -> None:
    layer = random.Random(1).randbytes(5 << 20)
    data = tar_of({"blobs/sha256/layer": layer, "manifest.json": b"[]", "index.json": b"{}"})
    sent: list[bytes] = []
    scanned = scan(chunked(data), sent.append)
    assert scanned.members == {"manifest.json": b"[]", "index.json": b"{}"}  # the 5 MiB layer is not kept
    forwarded = b"".join(sent)
    assert data.startswith(forwarded)
    # The engine has not yet got the whole of the last member (nor the end-of-archive blocks): it cannot act.
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        last = tar.getmembers()[-1]
    assert len(forwarded) < last.offset_data + last.size and len(data) - len(forwarded) >= HOLD
    scanned.release()
    assert b"".join(sent) == data


@pytest.mark.parametrize(
    ("files", "link", "why"),
    [
        ({"manifest.json": b"[]", "./manifest.json": b"[1]"}, None, "holds manifest.json twice"),
        ({"a/../index.json": b"{}", "index.json": b"{}"}, None, "holds index.json twice"),
        ({"manifest.json": b"[]"}, "blobs", "is a link"),
    ],
)
def test_what_two_readers_could_read_differently_is_refused(
    files: dict[str, bytes], link: str | None, why: str
) -> None:
    with pytest.raises(BadArchive, match=why):
        scan([tar_of(files, link=link)], lambda _: None)


def test_bytes_after_the_end_of_the_archive_are_refused() -> None:
    data = tar_of({"manifest.json": b"[]"})
    # Python's tarfile stops at the first zero block; what follows could be read by another reader.
    end = data.index(b"[]") + 512
    hidden = tar_of({"manifest.json": b"[1]"})
    with pytest.raises(BadArchive, match="goes on after the end"):
        scan([data[:end] + bytes(512) + hidden], lambda _: None)
    assert scan([data + bytes(4096)], lambda _: None).members == {"manifest.json": b"[]"}


def test_a_truncated_archive_is_not_a_tar() -> None:
    data = tar_of({"manifest.json": b"[]", "blob": random.Random(2).randbytes(100_000)})
    with pytest.raises(tarfile.TarError):
        scan(chunked(data[: len(data) // 2]), lambda _: None)


def test_gzip_is_decompressed_here_and_a_cut_one_is_refused() -> None:
    data = tar_of({"manifest.json": b"[]"}) + bytes(10 << 20)
    packed = gzip.compress(data)
    assert b"".join(gunzipped(chunked(packed, 4096))) == data
    assert max(len(c) for c in gunzipped([packed])) <= 4 << 20  # inflated a bounded chunk at a time
    with pytest.raises(tarfile.ReadError, match="cut short"):
        b"".join(gunzipped([packed[:-20]]))
