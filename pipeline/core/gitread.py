"""Read a git clone's index and small blobs without running git.

`validate --verify-hashes` compares files with the Git LFS pointers their
clone committed. Running `git` inside a package would run what the package's
own `.git/config` asks for (`core.fsmonitor`, hooks, filters), so this module
reads the two things it needs itself: the index (DIRC versions 2, 3 and 4)
and blob objects, loose or in packs (pack index v2, deltas applied: gitpack.py). It reads
nothing but files inside the `.git` folder: never a `.git` file's `gitdir:`,
never `objects/info/alternates`, never a special file, and every size it reads
is capped. Nothing in the repository's configuration is obeyed.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import struct
import zlib
from pathlib import Path

from raipack.core.gitpack import OFS_DELTA, TYPES, GitReadError, Pack, apply_delta, compressed_max, delta_sizes, varint

INDEX_MAX_BYTES = 64 * 1024 * 1024
MAX_ENTRIES = 200_000
MAX_PACKS = 256
MAX_DELTA_DEPTH = 1000  # git writes at most 50 (4095 is its hard limit)
BASE_MAX_BYTES = 1024 * 1024  # a delta base of a small blob larger than this is not read
CONFIG_MAX_BYTES = 64 * 1024


class NotFollowed(GitReadError):
    """`.git` is a file or link that points elsewhere; it is not followed."""


class MissingObject(GitReadError):
    """The index names an object the clone does not hold."""


class Repo:
    """The `.git` folder of a package, read as plain files."""

    def __init__(self, root: Path):
        self.dir = Path(root) / ".git"
        if os.path.islink(self.dir) or not self.dir.is_dir():
            raise NotFollowed("is a file or link pointing to a repository elsewhere, which raipack does not follow")
        self.real = os.path.realpath(self.dir)
        self.hashlen, self.algo = (32, "sha256") if _sha256_repo(self) else (20, "sha1")
        self._packs: list[Pack] | None = None
        self._broken: list[str] = []  # why packs could not be opened

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        for pack in self._packs or ():
            pack.close()
        self._packs = None

    @property
    def has_alternates(self) -> bool:
        return os.path.lexists(self.dir / "objects" / "info" / "alternates")

    # -- files --------------------------------------------------------------
    def open(self, rel: str) -> int | None:
        """A read-only descriptor of a regular file inside `.git`, None if absent."""
        path = os.path.join(self.real, rel)
        if not os.path.lexists(path):
            return None
        real = os.path.realpath(path)
        if os.path.commonpath([self.real, real]) != self.real:
            raise GitReadError(f"{rel} is a link leaving the .git folder")
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise GitReadError(f"{rel} cannot be read: {exc.strerror or exc}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise GitReadError(f"{rel} is not a regular file")
        return fd

    def read(self, rel: str, limit: int) -> bytes | None:
        fd = self.open(rel)
        if fd is None:
            return None
        try:
            if os.fstat(fd).st_size > limit:
                raise GitReadError(f"{rel} is larger than the {limit} bytes raipack reads")
            return _read_all(fd, limit)
        finally:
            os.close(fd)

    # -- the index ------------------------------------------------------------
    def index(self) -> dict[str, bytes]:
        """Path (as os.fsdecode gives it) -> blob id of each stage-0 regular file."""
        data = self.read("index", INDEX_MAX_BYTES)
        if data is None:
            return {}
        try:
            return _parse_index(data, self.hashlen, self.algo)
        except (IndexError, ValueError, struct.error) as exc:
            raise GitReadError(f"the index is damaged ({exc})") from None

    # -- objects --------------------------------------------------------------
    def small_blob(self, oid: bytes, limit: int) -> bytes | None:
        """The content of blob `oid`, or None when it is larger than `limit`
        bytes (or derives from a delta base too large to read)."""
        chain: list[bytes] = []  # deltas, outermost first
        want = limit
        where: tuple = ("oid", oid)
        for _ in range(MAX_DELTA_DEPTH + 1):
            if where[0] == "oid":
                found = self._locate(where[1])
                if found[0] == "loose":
                    kind, data = self._loose(where[1], want)
                    break
                pack, offset = found[1], found[2]
            else:
                pack, offset = where[1], where[2]
            kind, size, body, base = pack.header(offset)
            if kind in TYPES:
                kind, data = TYPES[kind], pack.inflate(body, size, want)
                break
            delta = pack.inflate(body, size, BASE_MAX_BYTES + 64)
            if delta is None:
                return None
            src, dst, _ = delta_sizes(delta)
            if dst > want or src > BASE_MAX_BYTES:
                return None
            chain.append(delta)
            want = src
            where = ("ofs", pack, base) if kind == OFS_DELTA else ("oid", base)
        else:
            raise GitReadError(f"object {oid.hex()} is a chain of more than {MAX_DELTA_DEPTH} deltas")
        if data is None:
            return None
        for delta in reversed(chain):
            data = apply_delta(data, delta)
        if len(data) > limit:
            return None
        if kind != b"blob":
            raise GitReadError(f"object {oid.hex()} is a {kind.decode()}, not a file's content")
        if hashlib.new(self.algo, b"blob %d\0" % len(data) + data).digest() != oid:
            raise GitReadError(f"object {oid.hex()} does not match its id (damaged)")
        return data

    def _locate(self, oid: bytes) -> tuple:
        hexid = oid.hex()
        if os.path.lexists(os.path.join(self.real, "objects", hexid[:2], hexid[2:])):
            return ("loose",)
        for pack in self.packs():
            offset = pack.find(oid)
            if offset is not None:
                return ("pack", pack, offset)
        if self._broken:
            raise GitReadError(f"object {hexid} is in no readable pack; {self._broken[0]}")
        raise MissingObject(f"object {hexid} is missing from the clone")

    def _loose(self, oid: bytes, limit: int) -> tuple[bytes, bytes | None]:
        hexid = oid.hex()
        rel = f"objects/{hexid[:2]}/{hexid[2:]}"
        fd = self.open(rel)
        if fd is None:
            raise MissingObject(f"object {hexid} is missing from the clone")
        try:
            raw = _read_all(fd, compressed_max(limit + 64))
        finally:
            os.close(fd)
        try:
            d = zlib.decompressobj()
            out = d.decompress(raw, limit + 64)
        except zlib.error as exc:
            raise GitReadError(f"{rel} is damaged ({exc})") from None
        head, nul, body = out.partition(b"\0")
        kind, _, size = head.partition(b" ")
        if not nul or kind not in TYPES.values() or not size.isdigit():
            raise GitReadError(f"{rel} is damaged (no object header)")
        if int(size) > limit:
            return kind, None
        if len(body) != int(size):
            raise GitReadError(f"{rel} is damaged (holds {len(body)} of {int(size)} bytes)")
        return kind, body

    def packs(self) -> list["Pack"]:
        if self._packs is None:
            self._packs = []
            pack_dir = os.path.join(self.real, "objects", "pack")
            try:
                names = sorted(n for n in os.listdir(pack_dir) if n.endswith(".idx"))[:MAX_PACKS]
            except OSError:
                names = []
            for name in names:
                idx = self.open(f"objects/pack/{name}")
                if idx is None:
                    continue
                pack = self.open(f"objects/pack/{name[:-4]}.pack")
                if pack is None:
                    os.close(idx)
                    continue
                try:
                    self._packs.append(Pack(name, idx, pack, self.hashlen))
                except GitReadError as exc:
                    self._broken.append(str(exc))
        return self._packs


def _read_all(fd: int, limit: int) -> bytes:
    chunks, got = [], 0
    while got <= limit:
        chunk = os.read(fd, min(1 << 20, limit + 1 - got))
        if not chunk:
            break
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)[: limit + 1]


def _sha256_repo(repo: Repo) -> bool:
    try:
        text = repo.read("config", CONFIG_MAX_BYTES) or b""
    except GitReadError:
        return False
    return re.search(rb"(?im)^\s*objectformat\s*=\s*sha256\s*$", text) is not None


def _parse_index(data: bytes, hashlen: int, algo: str) -> dict[str, bytes]:
    if len(data) < 12 + hashlen or data[:4] != b"DIRC":
        raise GitReadError("the index is not a git index (no DIRC header)")
    version, count = struct.unpack(">II", data[4:12])
    if version not in (2, 3, 4):
        raise GitReadError(f"the index has version {version}; raipack reads versions 2, 3 and 4")
    if count > MAX_ENTRIES:
        raise GitReadError(f"the index lists {count} entries, more than the {MAX_ENTRIES} raipack reads")
    end = len(data) - hashlen
    checksum = data[end:]
    if checksum != bytes(hashlen) and hashlib.new(algo, data[:end]).digest() != checksum:
        raise GitReadError("the index does not match its checksum (damaged)")
    entries, pos, prev = {}, 12, b""
    fixed = 40 + hashlen + 2
    for _ in range(count):
        start = pos
        if pos + fixed > end:
            raise GitReadError("the index is truncated")
        mode = int.from_bytes(data[pos + 24 : pos + 28], "big")
        oid = data[pos + 40 : pos + 40 + hashlen]
        flags = int.from_bytes(data[pos + fixed - 2 : pos + fixed], "big")
        pos += fixed
        if flags & 0x4000:
            if version < 3:
                raise ValueError("extended flags in a version 2 index")
            pos += 2
        if version == 4:
            strip, pos = varint(data, pos)
            if strip > len(prev):
                raise ValueError("a path strips more than the previous path holds")
            nul = data.find(b"\0", pos, end)
            if nul < 0:
                raise ValueError("a path has no end")
            name, pos = prev[: len(prev) - strip] + data[pos:nul], nul + 1
        else:
            nul = data.find(b"\0", pos, end)
            if nul < 0:
                raise ValueError("a path has no end")
            name = data[pos:nul]
            pos = start + ((nul - start) // 8 + 1) * 8
        if (flags & 0xFFF) != min(len(name), 0xFFF) or pos > end or not name:
            raise ValueError("an entry's length does not match its path")
        prev = name
        if (flags >> 12) & 3 == 0 and stat.S_ISREG(mode):
            entries[os.fsdecode(name)] = oid
    while pos < end:  # extensions
        if pos + 8 > end:
            raise ValueError("a truncated extension")
        sig, size = data[pos : pos + 4], int.from_bytes(data[pos + 4 : pos + 8], "big")
        if sig == b"link":
            raise GitReadError("the index is split (core.splitIndex), which raipack does not read")
        pos += 8 + size
    if pos != end:
        raise ValueError("extensions overrun the checksum")
    return entries
