"""AMD's NPU weights header (`model.pb.bin`, `model_jit.pb.bin`, `prefill.pb.bin`), read as the
runtime reads it: a protobuf `ryzenai.onnx_utils.proto.Header` whose fields are listed, with where
they are known from, in `pipeline/data/amd_header.json`. `decode` walks the wire format with the
standard library only and accepts what a protobuf parser accepts (unknown fields, groups, a known
field with another wire type kept as unknown, repeated scalars packed or not); it refuses what one
refuses (a field number 0, wire types 6 and 7, an end-group without its start, a varint longer than
ten bytes, a length past the end), naming the byte. It does not check that strings are UTF-8 (the
syntax of AMD's .proto file, which decides that, is not known here).

Its work is bounded by what it reads, not only by the file's size (issue 37): it stops with
`HeaderLimit` after MAX_FIELDS fields (every tag, known or not, every packed element, every field
inside a group) or MAX_MESSAGES messages. AMD's real headers are about 7 KB, a few thousand
fields; 16 MiB of empty messages took 26-150 s and up to 1.6 GB before the limits.
"""

from __future__ import annotations

from typing import NamedTuple

from raipack.data import load_data

MAX_DEPTH = 100  # protobuf's default recursion limit
MAX_FIELDS = 200_000  # AMD's 7 KB headers hold a few thousand; each costs about a microsecond here
MAX_MESSAGES = 50_000  # each message read becomes a dict (a few hundred bytes)
WIRE = {"uint64": 0, "int32": 0, "bool": 0, "string": 2, "strings": 2, "message": 2, "repeated": 2, "map": 2}


class HeaderError(ValueError):
    """The bytes are not a serialized Header; str() says what is wrong and at which byte."""


class HeaderLimit(HeaderError):
    """The header holds more fields or messages than raipack reads (it may well parse): str() says which limit, and where."""


class Extent(NamedTuple):
    node: str  # the operator (graph node) the tensor belongs to
    position: int  # its place in the operator's data list (not `index`: tuple has one)
    offset: int
    size: int

    @property
    def end(self) -> int:
        return self.offset + self.size


def _schema() -> dict:
    return load_data("amd_header.json")


def decode(raw: bytes) -> dict:
    """The Header in `raw` as nested dicts (field names as amd_header.json gives them; a field
    that is absent is absent). HeaderError when protobuf would refuse the bytes."""
    schema = _schema()
    return _Reader(memoryview(raw), schema["messages"]).message(0, len(raw), schema["root"], 0, {})


def weights_extents(header: dict) -> list[Extent]:
    """Every weight the header places in its weights file, in header order: the runtime reads
    `size` bytes at `offset` of parent(header)/external_data.filename for each."""
    out = []
    for node, op in (header.get("operators") or {}).items():
        for i, t in enumerate(op.get("data") or []):
            out.append(Extent(node, i, t.get("offset", 0), t.get("size", 0)))
    return out


class _Reader:
    def __init__(self, buf, messages: dict):
        self.buf = buf
        self.messages = messages
        self.fields = 0  # read so far, at any depth: the work done
        self.count = 0  # messages read so far

    def tick(self, pos: int, fields: int = 1) -> None:
        self.fields += fields
        if self.fields > MAX_FIELDS:
            raise HeaderLimit(f"holds more than {MAX_FIELDS} fields (the limit was passed at byte {pos})")

    def message(self, pos: int, end: int, kind: str, depth: int, out: dict, unknown: list | None = None) -> dict:
        """Parse the message at buf[pos:end] into `out` (a message seen again is merged into what
        was read before, as protobuf merges it); `unknown` gets a True for each unknown field."""
        if depth > MAX_DEPTH:
            raise HeaderError(f"messages nest deeper than {MAX_DEPTH} at byte {pos}")
        self.count += 1
        if self.count > MAX_MESSAGES:
            raise HeaderLimit(f"holds more than {MAX_MESSAGES} messages (the limit was passed at byte {pos})")
        fields = self.messages[kind]
        while pos < end:
            number, wire, value, pos = self.field(pos, end, depth)
            spec = fields.get(str(number))
            ftype = spec[1] if spec else ""
            if ftype == "packed_int64" and wire in (0, 2):
                if wire == 2 and isinstance(value, tuple):
                    self.packed(*value)
            elif spec is None or WIRE.get(ftype) != wire:
                if unknown is not None:  # kept aside by protobuf (a known number with another wire type too)
                    unknown.append(True)
            else:
                self.store(out, spec, value, depth)
        return out

    def field(self, pos: int, end: int, depth: int) -> tuple[int, int, object, int]:
        """(number, wire type, value, next position) of the field at `pos`: a varint's value, a
        length-delimited field's (start, end), None for the others."""
        start = pos
        self.tick(start)
        tag, pos = _varint(self.buf, pos, end)
        number, wire = _field(tag, start)
        if wire == 0:
            value, pos = _varint(self.buf, pos, end)
            return number, wire, value, pos
        if wire in (1, 5):
            pos += 8 if wire == 1 else 4
            if pos > end:
                raise HeaderError(f"a fixed-size field runs past the end at byte {start}")
            return number, wire, None, pos
        if wire == 2:
            length, pos = _varint(self.buf, pos, end)
            if pos + length > end:
                raise HeaderError(f"a field of {length} bytes at byte {start} runs past the end ({end - pos} bytes left)")
            return number, wire, (pos, pos + length), pos + length
        if wire == 3:
            return number, wire, None, _skip_group(self, pos, end, number, depth + 1)
        raise HeaderError(f"an end-group without its start at byte {start}" if wire == 4 else f"wire type {wire}, which protobuf does not have, at byte {start}")

    def store(self, out: dict, spec: list, value, depth: int) -> None:
        name, ftype = spec[0], spec[1]
        if ftype in ("uint64", "int32", "bool"):
            out[name] = bool(value) if ftype == "bool" else _signed32(value) if ftype == "int32" else value
            return
        a, b = value
        if ftype in ("string", "strings"):
            text = bytes(self.buf[a:b]).decode("utf-8", "replace")
            if ftype == "string":
                out[name] = text
            else:
                out.setdefault(name, []).append(text)
        elif ftype == "message":
            self.message(a, b, spec[2], depth + 1, out.setdefault(name, {}))
        elif ftype == "repeated":
            out.setdefault(name, []).append(self.message(a, b, spec[2], depth + 1, {}))
        else:  # map<string, message>: an entry is {1: key, 2: value}
            entry = self.entry(a, b, spec[2], depth + 1)
            if entry is not None:
                out.setdefault(name, {})[entry[0]] = entry[1]

    def entry(self, pos: int, end: int, kind: str, depth: int) -> tuple[str, dict] | None:
        """A map entry read as a message of two fields, protobuf's defaults where one is absent;
        None for an entry with other fields, which protobuf (upb) keeps as an unknown field of the
        parent instead of a map entry."""
        unknown: list = []
        name = f"_entry:{kind}"
        if name not in self.messages:  # once per kind: the map entry's schema
            self.messages = {**self.messages, name: {"1": ["key", "string"], "2": ["value", "message", kind]}}
        entry = self.message(pos, end, name, depth, {}, unknown)
        return None if unknown else (entry.get("key", ""), entry.get("value", {}))

    def packed(self, pos: int, end: int) -> None:
        while pos < end:
            self.tick(pos)
            _, pos = _varint(self.buf, pos, end)


def _skip_group(reader: _Reader, pos: int, end: int, number: int, depth: int) -> int:
    """The position after the end-group of group `number` that starts at `pos`."""
    buf = reader.buf
    open_groups = [number]
    while open_groups:
        reader.tick(pos)
        if len(open_groups) + depth > MAX_DEPTH:
            raise HeaderError(f"groups nest deeper than {MAX_DEPTH} at byte {pos}")
        if pos >= end:
            raise HeaderError(f"group {open_groups[-1]} is not closed before the end at byte {pos}")
        start = pos
        tag, pos = _varint(buf, pos, end)
        inner, wire = _field(tag, start)
        if wire == 0:
            _, pos = _varint(buf, pos, end)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        elif wire == 2:
            length, pos = _varint(buf, pos, end)
            pos += length
        elif wire == 3:
            open_groups.append(inner)
        elif wire == 4:
            if inner != open_groups[-1]:
                raise HeaderError(f"an end-group {inner} closes group {open_groups[-1]} at byte {start}")
            open_groups.pop()
        else:
            raise HeaderError(f"wire type {wire}, which protobuf does not have, at byte {start}")
        if pos > end:
            raise HeaderError(f"a field runs past the end at byte {start}")
    return pos


def _field(tag: int, at: int) -> tuple[int, int]:
    """(field number, wire type) of a tag; protobuf's numbers are 1 to 2**29 - 1."""
    if tag >> 3 == 0 or tag >> 32:
        raise HeaderError(f"a field number {tag >> 3}, outside protobuf's 1 to {(1 << 29) - 1}, at byte {at}")
    return tag >> 3, tag & 7


def _signed32(value: int) -> int:
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    start = pos
    while pos < end:
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise HeaderError(f"a varint longer than ten bytes at byte {start}")
    raise HeaderError(f"a varint runs past the end at byte {start}")
