"""Write a small image folder for the LightlyTrain example: ``count`` PNG images of coloured rectangles, the same
bytes on every machine (a seeded generator, no timestamps in the files), so every node's copy passes the data check.

    python3 make_images.py /tmp/nodekit-lightlytrain/images [--count 64] [--size 64]

Standard library only (a minimal PNG writer), so it runs on any host with Python, without the image's packages.
"""

from __future__ import annotations

import argparse
import random
import struct
import zlib
from pathlib import Path


def png(width: int, height: int, rgb: bytes) -> bytes:
    """An 8-bit RGB PNG of ``rgb`` (rows top to bottom, 3 bytes a pixel), every row with filter type 0."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    stride = 3 * width
    raw = b"".join(b"\x00" + rgb[y * stride : (y + 1) * stride] for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


def picture(rnd: random.Random, size: int) -> bytes:
    """A background colour and three rectangles of other colours, placed at random."""
    pixels = bytearray(bytes(rnd.randrange(256) for _ in range(3)) * (size * size))
    for _ in range(3):
        colour = bytes(rnd.randrange(256) for _ in range(3))
        x0, y0 = rnd.randrange(size // 2), rnd.randrange(size // 2)
        w, h = rnd.randrange(8, size // 2), rnd.randrange(8, size // 2)
        for y in range(y0, min(size, y0 + h)):
            row = (y * size + x0) * 3
            pixels[row : row + 3 * min(w, size - x0)] = colour * min(w, size - x0)
    return bytes(pixels)


def make(out: Path, count: int, size: int, seed: int = 0) -> list[Path]:
    rnd = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i in range(count):
        path = out / f"img-{i:04d}.png"
        path.write_bytes(png(size, size, picture(rnd, size)))
        written.append(path)
    return written


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path)
    p.add_argument("--count", type=int, default=64)
    p.add_argument("--size", type=int, default=64)
    args = p.parse_args()
    print(f"wrote {len(make(args.out, args.count, args.size))} images to {args.out}")


if __name__ == "__main__":
    main()
