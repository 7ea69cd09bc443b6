"""A package is a folder of files with roles, read without loading weights.

Scanning stats every file, reads at most the first bytes of small files (to
recognise Git LFS pointers and pickles) and parses JSON on demand with a size
cap. Every read goes through `Package.open`, which refuses a path that leaves
the package or is not a regular file (FIFO, device, socket) before opening it.
Nothing from the package is ever imported or executed.
"""

from __future__ import annotations

import fnmatch
import json
import os
import stat
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from raipack.core.findings import Finding
from raipack.core.jsonread import DuplicateKey, JsonError, ReadError, parse_json
from raipack.data import load_data

LFS_MAGIC = b"version https://git-lfs.github.com/spec/"
LFS_MAX_SIZE = 1024  # real pointers are ~130 bytes
JSON_MAX_BYTES = 64 * 1024 * 1024  # a larger "JSON" file is refused, not read
# The decoder graph keeps its weights in external data: AMD's and the OGA builder's model.onnx
# files are well under a MiB for an 8B model. Parsing costs about 150 bytes of memory per protobuf
# message, so besides the size, the number of messages is capped before parsing (pipeline/core/protowire.py).
GRAPH_MAX_BYTES = 64 * 1024 * 1024
GRAPH_MAX_NODES = 100_000  # an 8B decoder has a few thousand
GRAPH_MAX_FIELDS = 500_000  # protobuf fields of any kind (an 8B decoder has about 25 000); scanning them takes at most ~1 s
MAX_FILES = 100_000
PICKLE_MAGICS = (b"\x80\x02", b"\x80\x03", b"\x80\x04", b"\x80\x05")
ZIP_MAGIC = b"PK\x03\x04"

SCAN = "RP101"  # check id of the findings the scan itself produces


@dataclass(frozen=True)
class LfsPointer:
    oid: str  # "sha256:<hex>"
    size: int


@dataclass
class FileEntry:
    rel: str  # posix path relative to the package root
    size: int
    role: str
    lfs: LfsPointer | None = None
    symlink: bool = False

    @property
    def name(self) -> str:
        return self.rel.rsplit("/", 1)[-1]


def _roles():
    return load_data("roles.json")


def role_of(rel: str) -> str:
    name = rel.rsplit("/", 1)[-1]
    for pattern, role in _roles()["rules"]:
        if fnmatch.fnmatchcase(rel if "/" in pattern else name, pattern):
            return role
    return "other"


def parse_lfs_pointer(head: bytes) -> LfsPointer | None:
    """Parse a Git LFS pointer file's text; None when it is not one."""
    if not head.startswith(LFS_MAGIC):
        return None
    fields = {}
    for line in head.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        fields[key] = value.strip()
    try:
        return LfsPointer(oid=fields.get("oid", ""), size=int(fields.get("size", "-1")))
    except ValueError:
        return LfsPointer(oid=fields.get("oid", ""), size=-1)


@dataclass
class Package:
    root: Path
    files: dict[str, FileEntry] = field(default_factory=dict)
    dirs: set[str] = field(default_factory=set)
    scan_findings: list[Finding] = field(default_factory=list)
    _json: dict = field(default_factory=dict, repr=False)
    _duplicates: dict = field(default_factory=dict, repr=False)
    _small: dict = field(default_factory=dict, repr=False)  # rel -> the whole bytes of a file the scan read whole (<= LFS_MAX_SIZE)

    # -- scanning ---------------------------------------------------------
    @classmethod
    def scan(cls, root: Path, **place) -> "Package":  # place: a subclass's fields (pipeline/places/: where links may lead)
        root = Path(root)
        pkg = cls(root=root, **place)
        real_root = pkg.real_root
        stack = [("", root)]
        while stack:
            rel_dir, path = stack.pop()
            try:
                with os.scandir(path) as it:
                    entries = sorted(it, key=lambda e: e.name)
            except OSError as exc:
                pkg._scan_error(rel_dir, f"cannot list the folder: {exc.strerror or exc}", "check its permissions")
                continue
            for entry in entries:
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if entry.name == ".git" and not rel_dir:
                    continue
                pkg._scan_entry(entry, rel, real_root, stack)
                if len(pkg.files) > MAX_FILES:
                    pkg._scan_error("", f"more than {MAX_FILES} files; the rest were not scanned", "point raipack at the package folder itself, not a parent")
                    return pkg
        return pkg

    def _scan_error(self, rel: str, message: str, hint: str, severity: str = "error"):
        self.scan_findings.append(Finding(SCAN, severity, rel, message, hint))

    def _scan_entry(self, entry: os.DirEntry, rel: str, real_root: str, stack: list):
        is_link = entry.is_symlink()
        if is_link:
            target = os.path.realpath(entry.path)
            if not os.path.exists(target):
                self._scan_error(rel, "is a broken symlink or a symlink loop", "replace it with the real file")
                return
            if os.path.commonpath([real_root, target]) != real_root:
                self._scan_error(rel, f"is a symlink that leaves the package (to {target})", "copy the file into the package instead of linking to it")
                return
            if os.path.isdir(target):
                self._scan_error(rel, "is a symlink to a folder inside the package; it was not followed", "replace the link with the folder itself", "warning")
                return
        try:
            st = os.stat(entry.path)
        except OSError as exc:
            self._scan_error(rel, f"cannot be read: {exc.strerror or exc}", "check its permissions")
            return
        if stat.S_ISDIR(st.st_mode):
            self.dirs.add(rel)
            stack.append((rel, Path(entry.path)))
            return
        if not stat.S_ISREG(st.st_mode):
            self._scan_error(rel, "is not a regular file (device, socket or pipe)", "remove it from the package")
            return
        fe = FileEntry(rel=rel, size=st.st_size, role=role_of(rel), symlink=is_link)
        if 0 < st.st_size <= LFS_MAX_SIZE or fe.role in ("pickle", "npu_weights"):
            head = self._head(rel, fe)
            if head is not None:
                fe.lfs = parse_lfs_pointer(head) if st.st_size <= LFS_MAX_SIZE else None
                if len(head) == st.st_size:
                    self._small[rel] = head
                if fe.role == "npu_weights" and fe.lfs is None and _looks_pickled(head):
                    fe.role = "pickle"
        self.files[rel] = fe

    def _head(self, rel: str, fe: FileEntry, n: int = LFS_MAX_SIZE) -> bytes | None:
        try:
            with self.open(rel) as fh:
                return fh.read(n)
        except ReadError as exc:
            self._scan_error(rel, str(exc), exc.hint)
            return None

    # -- reading --------------------------------------------------------------
    @cached_property
    def real_root(self) -> str:
        return os.path.realpath(self.root)

    def open(self, rel: str):
        """Open package file `rel` for reading in binary. Raises ReadError, before
        opening anything, when the path resolves outside the package or is not a
        regular file; the open descriptor is checked again (a file swapped for a
        FIFO after the check is refused, and opening never blocks on one)."""
        real = os.path.realpath(self.root / rel)
        if os.path.commonpath([self.real_root, real]) != self.real_root:
            raise ReadError(f"resolves outside the package (to {real})", "copy the file into the package instead of linking to it")
        try:
            if not stat.S_ISREG(os.stat(real).st_mode):
                raise ReadError(NOT_REGULAR, "remove it from the package")
            fd = os.open(real, os.O_RDONLY | _O_NONBLOCK | _O_NOFOLLOW | _O_NOCTTY)
        except OSError as exc:
            raise ReadError(f"cannot be read: {exc.strerror or exc}", "check its permissions") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ReadError(NOT_REGULAR, "remove it from the package")
        return os.fdopen(fd, "rb")

    def read_bytes(self, rel: str, limit: int, what: str = "file") -> bytes:
        """The whole of `rel`, refused (ReadError) when it is larger than `limit` bytes."""
        try:
            with self.open(rel) as fh:
                raw = fh.read(limit + 1)
        except OSError as exc:
            raise ReadError(f"cannot be read: {exc.strerror or exc}", "check its permissions") from None
        if len(raw) > limit:
            raise ReadError(f"is larger than the {limit} bytes a {what} may have", "check that the right file was placed here")
        return raw

    def scanned_bytes(self, rel: str, limit: int, what: str = "file") -> bytes:
        """As read_bytes, but a small file the scan read whole (a .state, a .const) is not read again."""
        small = self._small.get(rel)
        return small if small is not None and len(small) <= limit else self.read_bytes(rel, limit, what)

    def raw_json(self, rel: str, limit: int) -> bytes:
        """The bytes a loader of `rel` reads: the file's, or a virtual document's as JSON text."""
        if rel in self._json and not isinstance(self._json[rel], JsonError) and not os.path.lexists(self.root / rel):
            return json.dumps(self._json[rel], indent=2, ensure_ascii=False).encode()
        return self.read_bytes(rel, limit, "JSON config")

    def add_virtual_json(self, rel: str, doc) -> None:
        """Treat `doc` as the content of `rel` without writing it (validating a
        folder as it will be once its manifest is written); None hides `rel`."""
        if doc is None:
            self.files.pop(rel, None)
            return
        size = len(json.dumps(doc, indent=2)) + 1
        self.files[rel] = FileEntry(rel=rel, size=size, role=role_of(rel))
        self._json[rel] = doc

    # -- queries ------------------------------------------------------------
    def by_role(self, *roles: str) -> list[FileEntry]:
        return [f for f in self.files.values() if f.role in roles]

    def has(self, rel: str) -> bool:
        return rel in self.files

    def path(self, rel: str) -> Path:
        return self.root / rel

    @cached_property
    def name(self) -> str:
        return Path(os.path.abspath(self.root)).name

    def json(self, rel: str):
        """Parsed JSON of `rel`, or raise JsonError with a user-facing sentence."""
        if rel in self._json:
            value = self._json[rel]
            if isinstance(value, JsonError):
                raise value
            return value
        try:
            value = self._load_json(rel)
        except JsonError as exc:
            self._json[rel] = exc
            raise
        self._json[rel] = value
        return value

    def try_json(self, rel: str):
        """Parsed JSON, or None when missing or broken (the json checks report why)."""
        if rel not in self.files:
            return None
        try:
            return self.json(rel)
        except JsonError:
            return None

    def _load_json(self, rel: str):
        fe = self.files.get(rel)
        if fe is None:
            if rel in self.dirs:
                raise JsonError("is a folder where a JSON file belongs", "replace the folder with the file")
            raise JsonError("is missing", "add the file to the package")
        if fe.lfs:
            raise JsonError("is a Git LFS pointer, not the JSON file", "run `git lfs pull` in the package's clone")
        if fe.size > JSON_MAX_BYTES:
            raise JsonError(f"is {fe.size} bytes, more than the {JSON_MAX_BYTES} bytes a JSON config may have", "check that the right file was placed here")
        try:
            raw = self.read_bytes(rel, JSON_MAX_BYTES, "JSON config")
            text = raw.decode("utf-8-sig")
            doc, duplicates = parse_json(text)
        except ReadError as exc:
            raise JsonError(str(exc), exc.hint, exc.pointer) from None
        except UnicodeDecodeError as exc:
            raise JsonError(f"is not UTF-8 text (byte {exc.start})", "save the file as UTF-8") from None
        except MemoryError:
            raise JsonError(f"could not be parsed in the memory available ({fe.size} bytes)", "free memory, or check that the right file was placed here") from None
        if duplicates:
            self._duplicates[rel] = duplicates
        return doc

    def duplicate_keys(self, rel: str) -> list[DuplicateKey]:
        """Keys that occur more than once in one object of `rel` (after `json(rel)`)."""
        return self._duplicates.get(rel, [])


NOT_REGULAR = "is not a regular file (device, socket or pipe)"
_O_NONBLOCK, _O_NOFOLLOW, _O_NOCTTY = (getattr(os, n, 0) for n in ("O_NONBLOCK", "O_NOFOLLOW", "O_NOCTTY"))


def read_regular(path: Path, limit: int) -> bytes:
    """At most `limit` + 1 bytes of `path`, opened without blocking and read only when it is a regular file
    (ReadError otherwise: a FIFO would hang the read, a folder or device is no input)."""
    fd = os.open(path, os.O_RDONLY | _O_NONBLOCK | _O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ReadError(f"{path} {NOT_REGULAR}", "give the file itself")
        with os.fdopen(fd, "rb") as fh:
            fd = -1
            return fh.read(limit + 1)
    finally:
        if fd >= 0:
            os.close(fd)


def _looks_pickled(head: bytes) -> bool:
    if head[:2] in PICKLE_MAGICS:
        return True
    return head.startswith(ZIP_MAGIC) and b"data.pkl" in head
