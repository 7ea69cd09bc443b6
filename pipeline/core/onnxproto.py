"""ONNX's protobuf messages without the onnx package's import.

`import onnx` loads numpy, onnx.helper, the operator schemas and the C extension: about a quarter
of a second, more than the rest of `raipack validate`. Reading a graph needs only the message
classes, which onnx's generated module `onnx.onnx_ml_pb2` defines with protobuf alone; it is
loaded from the installed onnx package under its own name, so a later `import onnx` reuses it and
a ModelProto parsed here is an `onnx.ModelProto`. Nothing else of onnx runs.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import lru_cache

from google.protobuf.message import DecodeError

from raipack.data import load_data

_PB2 = "onnx.onnx_ml_pb2"


def _messages():
    module = sys.modules.get(_PB2)
    if module is not None:
        return module
    if "onnx" in sys.modules:  # onnx is loaded already: its own import is free
        return importlib.import_module(_PB2)
    spec = importlib.util.find_spec("onnx")  # finds the package without running its __init__
    location = next(iter(spec.submodule_search_locations or ()), None) if spec else None
    pb2 = importlib.util.spec_from_file_location(_PB2, f"{location}/onnx_ml_pb2.py") if location else None
    if pb2 is None or pb2.loader is None:
        return importlib.import_module(_PB2)  # an unusual install: the ordinary import says what is missing
    module = importlib.util.module_from_spec(pb2)
    sys.modules[_PB2] = module
    try:
        pb2.loader.exec_module(module)
    except BaseException:
        del sys.modules[_PB2]
        raise
    return module


_pb = _messages()
ModelProto = _pb.ModelProto
TensorProto = _pb.TensorProto
AttributeProto = _pb.AttributeProto


def load_model(raw: bytes):
    """A ModelProto from its serialized bytes, as `onnx.load_model_from_string` parses them
    (protobuf's own parser; every byte must belong to the message)."""
    model = ModelProto()
    decoded = model.ParseFromString(raw)
    if decoded is not None and decoded != len(raw):
        raise DecodeError(f"Protobuf decoding consumed too few bytes: {decoded} out of {len(raw)}")
    _check_names(model)
    return model


def _check_names(model) -> None:
    """Every name and external-data entry of the graphs a text (DecodeError otherwise). protobuf hands a string
    field that is not UTF-8 back as bytes, which the readers then compare with text: one flipped bit in a name
    was a TypeError (issue 24)."""
    graphs = [model.graph, *(f for f in model.functions)]
    while graphs:
        g = graphs.pop()
        ios = [*g.input, *g.output, *getattr(g, "value_info", ())]
        texts = [v if isinstance(v, (str, bytes)) else v.name for v in ios]  # a function's are names, a graph's ValueInfos
        for t in getattr(g, "initializer", ()):
            texts += [t.name, *(e.key for e in t.external_data), *(e.value for e in t.external_data)]
        for node in g.node:
            texts += [node.name, node.op_type, node.domain, *node.input, *node.output, *(a.name for a in node.attribute)]
            for a in node.attribute:
                graphs += ([a.g] if a.HasField("g") else []) + list(a.graphs)
        bad = next((x for x in texts if not isinstance(x, str)), None)
        if bad is not None:
            raise DecodeError(f"the graph holds a name that is not UTF-8 text ({bytes(bad)[:40]!r})")


# attribute type → (the field holding its value, whether it is a repeated field)
_FIELDS = {"FLOAT": "f", "INT": "i", "STRING": "s", "TENSOR": "t", "SPARSE_TENSOR": "sparse_tensor", "GRAPH": "g", "TYPE_PROTO": "tp"}
_LISTS = {"FLOATS": "floats", "INTS": "ints", "STRINGS": "strings", "TENSORS": "tensors", "SPARSE_TENSORS": "sparse_tensors",
          "GRAPHS": "graphs", "TYPE_PROTOS": "type_protos"}
_BY_TYPE = {AttributeProto.AttributeType.Value(k): (f, k in _LISTS) for k, f in {**_FIELDS, **_LISTS}.items()}


def get_attribute_value(attr):
    """An attribute's value by its declared type, as `onnx.helper.get_attribute_value` gives it."""
    if attr.ref_attr_name:
        raise ValueError(f"Cannot get value of reference attribute: {attr}")
    if attr.type in _BY_TYPE:
        name, repeated = _BY_TYPE[attr.type]
        return list(getattr(attr, name)) if repeated else getattr(attr, name)
    if attr.type == AttributeProto.UNDEFINED:
        return None
    raise ValueError(f"Unsupported ONNX attribute: {attr}")


@lru_cache(maxsize=None)
def _element_bits() -> dict[int, int]:
    table = load_data("onnx_element_bits.json")["bits"]
    return {TensorProto.DataType.Value(name): bits for name, bits in table.items() if name in TensorProto.DataType.keys()}


def tensor_nbytes(t) -> int | None:
    """The bytes a tensor's data takes (4-bit types two to a byte), or None for a type without a size."""
    bits = _element_bits().get(t.data_type)
    if bits is None:
        return None
    count = 1
    for d in t.dims:
        count *= d
    return (count * bits + 7) // 8
