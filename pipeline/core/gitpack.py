"""Git pack files read as plain files (pipeline/core/gitread.py reads the clone around them): the
pack index (version 2), object headers, inflating with every size capped, and deltas applied.
Nothing here runs git or obeys a repository's configuration."""

from __future__ import annotations

import os
import struct
import zlib

OFS_DELTA, REF_DELTA = 6, 7
TYPES = {1: b"commit", 2: b"tree", 3: b"blob", 4: b"tag"}


class GitReadError(Exception):
    """A clone raipack cannot read; str() is the reason, said to a user."""


class Pack:
    """One pack file and its index (version 2), read with pread."""

    def __init__(self, name: str, idx: int, pack: int, hashlen: int):
        self.name, self.idx, self.pack, self.hashlen = name[:-4], idx, pack, hashlen
        self.pack_size = os.fstat(pack).st_size
        head = os.pread(idx, 8 + 1024, 0)
        if len(head) != 8 + 1024 or head[:4] != b"\xfftOc" or head[4:8] != b"\0\0\0\x02":
            self.close()
            raise GitReadError(f"objects/pack/{name} is not a pack index of version 2, the one raipack reads")
        self.fanout = struct.unpack(">256I", head[8:])
        self.count = self.fanout[255]
        need = 1032 + self.count * (hashlen + 8) + 2 * hashlen
        if os.fstat(idx).st_size < need or os.pread(pack, 4, 0) != b"PACK" or any(a > b for a, b in zip(self.fanout, self.fanout[1:])):
            self.close()
            raise GitReadError(f"objects/pack/{name[:-4]}.idx or .pack is damaged (shorter than its {self.count} objects need, or no PACK header)")

    def close(self) -> None:
        for fd in (self.idx, self.pack):
            try:
                os.close(fd)
            except OSError:
                pass

    def find(self, oid: bytes) -> int | None:
        lo = self.fanout[oid[0] - 1] if oid[0] else 0
        hi = self.fanout[oid[0]]
        if not lo <= hi <= self.count:
            raise GitReadError(f"objects/pack/{self.name}.idx is damaged (fan-out table)")
        n = self.hashlen
        while lo < hi:
            mid = (lo + hi) // 2
            name = os.pread(self.idx, n, 1032 + mid * n)
            if name == oid:
                return self._offset(mid)
            if name < oid:
                lo = mid + 1
            else:
                hi = mid
        return None

    def _offset(self, i: int) -> int:
        table = 1032 + self.count * (self.hashlen + 4)
        (value,) = struct.unpack(">I", os.pread(self.idx, 4, table + 4 * i))
        if value & 0x80000000:
            raw = os.pread(self.idx, 8, table + 4 * self.count + 8 * (value & 0x7FFFFFFF))
            if len(raw) != 8:
                raise GitReadError(f"objects/pack/{self.name}.idx is damaged (offset table)")
            (value,) = struct.unpack(">Q", raw)
        if not 12 <= value < self.pack_size - self.hashlen:
            raise GitReadError(f"objects/pack/{self.name}.idx is damaged (an offset points outside the pack)")
        return value

    def header(self, offset: int) -> tuple:
        """(type, size, offset of the compressed data, base offset or id)."""
        raw = os.pread(self.pack, 32 + self.hashlen, offset)
        try:
            c = raw[0]
            kind, size, shift, pos = (c >> 4) & 7, c & 15, 4, 1
            while c & 0x80:
                c = raw[pos]
                size |= (c & 0x7F) << shift
                shift, pos = shift + 7, pos + 1
                if shift > 70:
                    raise IndexError
            base: int | bytes | None = None
            if kind == OFS_DELTA:
                back, pos = varint(raw, pos)
                base = offset - back
                if not 12 <= base < offset:
                    raise IndexError
            elif kind == REF_DELTA:
                base = raw[pos : pos + self.hashlen]
                pos += self.hashlen
                if len(base) != self.hashlen:
                    raise IndexError
            elif kind not in TYPES:
                raise IndexError
        except (IndexError, ValueError):
            raise GitReadError(f"objects/pack/{self.name}.pack is damaged (object header at offset {offset})") from None
        return (kind, size, offset + pos, base)

    def inflate(self, start: int, size: int, limit: int) -> bytes | None:
        """Exactly `size` bytes inflated from `start`; None when size > limit."""
        if size > limit:
            return None
        d = zlib.decompressobj()
        out = b""
        pos, budget = start, compressed_max(size)
        try:
            while len(out) <= size and not d.eof:
                data = d.unconsumed_tail
                if not data:
                    data = os.pread(self.pack, min(65536, budget), pos) if budget > 0 else b""
                    if not data:
                        break
                    pos, budget = pos + len(data), budget - len(data)
                out += d.decompress(data, size + 1 - len(out))
        except zlib.error as exc:
            raise GitReadError(f"objects/pack/{self.name}.pack is damaged ({exc})") from None
        if len(out) != size:
            raise GitReadError(f"objects/pack/{self.name}.pack is damaged (an object inflates to {len(out)} bytes, not {size})")
        return out


def compressed_max(size: int) -> int:
    """Most bytes zlib needs for `size` bytes (stored blocks cost 5 in 16 KiB)."""
    return size + size // 8 + 4096


def varint(data: bytes, pos: int) -> tuple[int, int]:
    """The index v4 / OFS_DELTA offset encoding (big-endian, with +1 per byte)."""
    c = data[pos]
    value, pos = c & 0x7F, pos + 1
    while c & 0x80:
        c = data[pos]
        value, pos = ((value + 1) << 7) | (c & 0x7F), pos + 1
        if value > 1 << 48:
            raise ValueError("bad variable-length number")
    return value, pos


def delta_sizes(delta: bytes) -> tuple[int, int, int]:
    """Source size, result size, and where the instructions start."""
    sizes, pos = [], 0
    try:
        for _ in range(2):
            value, shift = 0, 0
            while True:
                c = delta[pos]
                value, pos, shift = value | (c & 0x7F) << shift, pos + 1, shift + 7
                if not c & 0x80:
                    break
                if shift > 63:
                    raise IndexError
            sizes.append(value)
    except IndexError:
        raise GitReadError("a delta in a pack is damaged (header)") from None
    return sizes[0], sizes[1], pos


def apply_delta(base: bytes, delta: bytes) -> bytes:
    src, dst, pos = delta_sizes(delta)
    if src != len(base):
        raise GitReadError(f"a delta in a pack is damaged (base of {len(base)} bytes, expected {src})")
    out = bytearray()
    try:
        while pos < len(delta):
            c = delta[pos]
            pos += 1
            if c & 0x80:
                offset = size = 0
                for i in range(4):
                    if c & (1 << i):
                        offset |= delta[pos] << (8 * i)
                        pos += 1
                for i in range(3):
                    if c & (0x10 << i):
                        size |= delta[pos] << (8 * i)
                        pos += 1
                size = size or 0x10000
                if offset + size > len(base):
                    raise IndexError
                out += base[offset : offset + size]
            elif c and pos + c <= len(delta):
                out += delta[pos : pos + c]
                pos += c
            else:
                raise IndexError
            if len(out) > dst:
                raise IndexError
    except IndexError:
        raise GitReadError("a delta in a pack is damaged (instructions)") from None
    if len(out) != dst:
        raise GitReadError("a delta in a pack is damaged (result size)")
    return bytes(out)
