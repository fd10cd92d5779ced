"""What nodekit keeps of a stream it reads only for messages (nodekit/system/docker/streams.py): a real process
writes far more than any engine would, and nodekit keeps its last lines, not all of it."""

from __future__ import annotations

import pytest

from nodekit.errors import ShipError
from nodekit.system.docker.streams import LoadSink

FLOOD = 32 << 20
KEEP = 64 << 10


def test_a_load_that_floods_its_stderr_is_kept_to_its_last_64_kib_and_its_last_line_still_says_why() -> None:
    """32 MiB on stderr (many lines, then one line of 8 MiB without an end, then the real reason): nodekit holds
    64 KiB of it, the reason among them, and never a line cut in half at the start."""
    flood = (f"cat > /dev/null; yes 'a chatty engine line' | head -c {FLOOD - (8 << 20)} >&2; "
             f"head -c {8 << 20} /dev/zero | tr '\\0' x >&2; echo >&2; "
             "echo 'Error: the real reason' >&2; exit 1")  # fmt: skip
    sink = LoadSink(argv=["sh", "-c", flood])
    sink.write(b"the stream")
    with pytest.raises(ShipError, match="the real reason"):
        sink.finish()
    kept = len(sink.stderr.encode())
    assert 0 < kept <= KEEP, f"nodekit kept {kept} bytes of a load's stderr"
    assert sink.stderr.endswith("Error: the real reason\n")
    assert set(sink.stderr.splitlines()[:-1]) <= {"x" * len(sink.stderr.splitlines()[0])}
