"""What the reference runtime checks before it reads a package file.

- The package is scanned first (`raipack.core.package.Package.scan`): a FIFO, device or socket,
  a broken symlink or one that leaves the package refuses the package before anything is opened.
- A file a config names (`model.decoder.filename`, `external_data_file`, an initializer's external
  data `location`) must be one of the scanned files: a relative path inside the package, a regular
  file, no larger than the cap of its kind.
- `genai_config.json` and `rai_config.json` must follow their JSON Schemas.
- Where `manifest.json` is present, every weights file it records must have the recorded size and,
  when hashes are verified, the recorded sha256 (hashed in parallel, on a thread, while the caller
  checks `model.bin` tensor by tensor through its header). Files the runtime reads that hold weights
  but are not listed are refused too.
"""

from __future__ import annotations

import posixpath
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from raipack.core.errors import RaipackError
from raipack.core.hashing import sha256_many
from raipack.core.package import GRAPH_MAX_BYTES, JSON_MAX_BYTES, JsonError, Package, ReadError, role_of
from raipack.core.schemas import errors

WEIGHT_ROLES = ("npu_weights", "external_data", "npu_header", "graph", "metastate")  # must be listed, with their size
HASHED_ROLES = ("external_data", "npu_header", "graph", "tokenizer", "chat_template")  # and these their sha256
# model.bin is hashed tensor by tensor against its header (formats.WeightsFile); the header and each plan carry
# a sha256 of their own, and every .state those of its plan, the header and the graph.


def first_line(exc: BaseException) -> str:
    """`Type: the first line of its message`, at most 300 characters: an error from a library in one line."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class PackageError(RaipackError):
    """The package cannot be run as it is (missing, corrupt or inconsistent files); `hint` is the next step.
    Its own class so a caller can tell a package that cannot run from a prompt the package refuses (RuntimeRefusal)."""


class PackageFiles:
    """The scanned files of a package folder, read only through the checks above."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.scan = Package.scan(self.root)
        bad = [f for f in self.scan.scan_findings if f.severity == "error"]
        if bad:
            raise PackageError(f"{self.root / bad[0].path} {bad[0].message}", bad[0].hint)

    def name(self, value, source: str) -> str:
        """The package file `value` (a path from a config, named in `source`) as its scanned relative path."""
        rel = posixpath.normpath(value) if isinstance(value, str) and value and not value.startswith("/") else None
        if rel is None or rel.startswith("..") or rel not in self.scan.files:
            raise PackageError(f"{source} names {value!r}, which is not a file of the package {self.root} (a relative path to a regular file inside it is expected)",
                               "rebuild the package; raipack reads no file outside it")
        return rel

    def path(self, value, source: str) -> Path:
        return self.root / self.name(value, source)

    def size(self, rel: str) -> int:
        return self.scan.files[rel].size

    def read(self, value, source: str, limit: int, what: str) -> bytes:
        """The whole file, at most `limit` bytes, opened so that a file swapped for a FIFO since the scan is refused too."""
        rel = self.name(value, source)
        if self.size(rel) > limit:
            raise PackageError(f"{self.root / rel} is {self.size(rel)} bytes, more than the {limit} bytes a {what} may have", "check that the right file was placed here")
        try:
            return self.scan.read_bytes(rel, limit, what)
        except ReadError as exc:
            raise PackageError(f"{self.root / rel} {exc}", exc.hint) from None

    def check_sizes(self, roles: tuple[str, ...], what: str, limit: int = JSON_MAX_BYTES) -> None:
        """Refuses a file of one of `roles` larger than `limit` before a library reads it whole."""
        for rel, fe in self.scan.files.items():
            if fe.role in roles and fe.size > limit:
                raise PackageError(f"{self.root / rel} is {fe.size} bytes, more than the {limit} bytes a {what} may have", "check that the right file was placed here")

    def json(self, rel: str, schema: str | None = None, required: bool = True):
        """Parsed JSON of `rel` (None when absent and not `required`), checked against `schema`."""
        if not required and rel not in self.scan.files:
            return None
        try:
            doc = self.scan.json(rel)
        except JsonError as exc:
            raise PackageError(f"{self.root / rel} {exc}", exc.hint or "rebuild the package") from None
        if schema:

            problems = errors(schema, doc)
            if problems:
                raise PackageError(f"{self.root / rel}: {problems[0][1]}", "rebuild the package, or fix the value by hand")
        return doc

    # ------------------------------------------------------------------ manifest.json

    def check_manifest(self, hashes: bool) -> Future:
        """Checks the weights files against manifest.json on a thread; `.result()` raises PackageError
        for the first problem (a file unlisted, missing, of another size, or with another sha256 when
        `hashes`). Without manifest.json there is nothing recorded to check against: `.result()` is False."""
        pool = ThreadPoolExecutor(1)
        future = pool.submit(self._check_manifest, hashes)
        pool.shutdown(wait=False)
        return future

    def _check_manifest(self, hashes: bool) -> bool:
        if "manifest.json" not in self.scan.files:
            return False
        recorded = self._recorded()
        for rel, fe in self.scan.files.items():
            if fe.role in WEIGHT_ROLES and rel not in recorded:
                raise PackageError(f"{self.root / rel} is not listed in manifest.json: it was added or renamed after the build", "rebuild the package, or copy it again")
        todo = {}
        for rel, entry in recorded.items():
            fe = self.scan.files.get(rel)
            role = fe.role if fe else role_of(rel)
            if role not in WEIGHT_ROLES and role not in HASHED_ROLES:
                continue
            if fe is None:
                raise PackageError(f"{self.root / rel} is missing; manifest.json records it", "copy the complete package again")
            if entry.get("size") != fe.size:
                raise PackageError(f"{self.root / rel} is {fe.size} bytes; manifest.json records {entry.get('size')!r}", "the file was changed or truncated after the build; rebuild the package or copy it again")
            if role in HASHED_ROLES:
                todo[self.root / rel] = entry.get("sha256")
        if hashes:
            self._hash(todo)
        return True

    def _recorded(self) -> dict[str, dict]:
        doc = self.json("manifest.json")
        files = doc.get("files") if isinstance(doc, dict) else None
        if not isinstance(files, list) or not all(isinstance(e, dict) and isinstance(e.get("path"), str) for e in files):
            raise PackageError(f"{self.root / 'manifest.json'}: /files is not a list of entries with a path", "rebuild the package; raipack writes the manifest last")
        return {posixpath.normpath(e["path"]): e for e in files}

    def _hash(self, todo: dict[Path, object]) -> None:

        for path, digest in sorted(sha256_many(list(todo)).items()):
            if isinstance(digest, OSError):
                raise PackageError(f"{path} cannot be read to check it: {digest.strerror or digest}", "check its permissions")
            if digest != todo[path]:
                raise PackageError(f"{path} has sha256 {digest[:16]}…, not the {str(todo[path])[:16]}… manifest.json records: it is corrupt or was replaced after the build",
                                   "rebuild the package, or copy it again")


__all__ = ["GRAPH_MAX_BYTES", "JSON_MAX_BYTES", "PackageError", "PackageFiles", "first_line"]
