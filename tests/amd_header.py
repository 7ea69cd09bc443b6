"""AMD's NPU weights header written by protobuf itself (not by raipack's reader's author): the message
types of pipeline/data/amd_header.json built as a protobuf descriptor, so fakes and the real-corpus
rebuild get headers laid out as AMD's writer (ryzenai_onnx_utils jit.py) lays them out, and the tests
can hold raipack's reader to protobuf's parser."""

from __future__ import annotations

from functools import lru_cache

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from raipack.data import load_data

PACKAGE = "ryzenai.onnx_utils.proto"
_SCALARS = {"uint64": "TYPE_UINT64", "int32": "TYPE_INT32", "bool": "TYPE_BOOL", "string": "TYPE_STRING",
            "strings": "TYPE_STRING", "packed_int64": "TYPE_INT64"}


@lru_cache(maxsize=None)
def header_class():
    """The generated message class of ryzenai.onnx_utils.proto.Header."""
    F = descriptor_pb2.FieldDescriptorProto
    fd = descriptor_pb2.FileDescriptorProto(name="external_data.proto", package=PACKAGE, syntax="proto2")
    for name, fields in load_data("amd_header.json")["messages"].items():
        msg = fd.message_type.add(name=name)
        for number, (fname, kind, *sub) in sorted(fields.items(), key=lambda kv: int(kv[0])):
            field = msg.field.add(name=fname, number=int(number))
            field.label = F.LABEL_REPEATED if kind in ("strings", "packed_int64", "repeated", "map") else F.LABEL_OPTIONAL
            if kind in _SCALARS:
                field.type = getattr(F, _SCALARS[kind])
                continue
            field.type = F.TYPE_MESSAGE
            if kind != "map":
                field.type_name = f".{PACKAGE}.{sub[0]}"
                continue
            entry = msg.nested_type.add(name=fname.title().replace("_", "") + "Entry")
            entry.options.map_entry = True
            entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
            entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=F.LABEL_OPTIONAL, type_name=f".{PACKAGE}.{sub[0]}")
            field.type_name = f".{PACKAGE}.{name}.{entry.name}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.Header"))


def header_bytes(weights: str, tensors: list[tuple[str, int, int]], *, size: int | None = None) -> bytes:
    """A Header naming `weights` ('' for no JIT weights) with the (node, offset, size) tensors, as
    jit.py writes one (one Operator per node, its data in order, op metadata per op type); grown to
    `size` bytes with a layer's operator names when given."""
    header = header_class()()
    header.external_data.filename = weights
    header.external_data.npu = bool(weights)
    for node, offset, nbytes in tensors:
        op = header.operators[node]
        op.op_type = "MatMulNBits"
        op.data.add(offset=offset, size=nbytes, shape=[nbytes], data_type=3)
        meta = header.op_metadata["MatMulNBits"]
        meta.max_npu_buffer_size = max(meta.max_npu_buffer_size, nbytes)
        meta.first = meta.first or node
        meta.last = node
    if size is not None:
        layer = header.layers.add(offset=0, size=sum(t[2] for t in tensors))
        layer.operators.append("")
        pad = 0
        for _ in range(4):  # the string's length prefix grows by a byte or two as it grows
            pad = max(0, pad + size - header.ByteSize())
            layer.operators[0] = "." * pad
        if header.ByteSize() != size:
            raise ValueError(f"cannot grow a header to exactly {size} bytes")
    return header.SerializeToString()
