"""Static shapes: every tensor's (dtype, shape) at fixed input shapes, and the execution order with
each node's device and scratch bytes (what a plan records). One rule per operator type; small
integer tensors (shapes, indices) are computed as values so Reshape and If can be resolved."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from raipack.npu.formats import ONNX_DTYPE
from raipack.stages.fuse.graph.model import DOMAIN


class ShapeError(ValueError):
    pass


def dtype_name(code: int) -> str:
    if code not in ONNX_DTYPE:
        raise ShapeError(f"unsupported tensor data type {code}")
    return ONNX_DTYPE[code]


def _broadcast(*shapes):
    rank = max(len(s) for s in shapes)
    out = []
    for dims in zip(*[[1] * (rank - len(s)) + list(s) for s in shapes]):
        big = [d for d in dims if d != 1]
        if len(set(big)) > 1:
            raise ShapeError(f"shapes {shapes} do not broadcast")
        out.append(big[0] if big else 1)
    return out


class _Node:
    """One node being inferred: its inputs' (dtype, shape) and values, its attributes, and `put` for its outputs."""

    def __init__(self, node, info: dict, values: dict, attrs: dict, functions: dict, scratch: list):
        self.node, self.name, self.op = node, node.name, node.op_type
        self.info, self.values, self.attrs, self.functions, self.scratch = info, values, attrs, functions, scratch
        self.ins = [info.get(i) if i else None for i in node.input]
        self.vals = [values.get(i) if i else None for i in node.input]
        self.outs = list(node.output)

    def a(self, name, default=None):
        return self.attrs.get(name, default)

    def put(self, k, dtype, shape, value=None):
        if k < len(self.outs) and self.outs[k]:
            self.info[self.outs[k]] = (dtype, [int(d) for d in shape])
            if value is not None:
                self.values[self.outs[k]] = value

    def same(self, shape, value=None):
        """Output 0 with input 0's dtype."""
        self.put(0, self.ins[0][0], shape, value)


def _function(n: _Node):
    fn = n.functions[n.op]
    local_info, local_vals = {}, {}
    for formal, actual in zip(fn.input, n.node.input):
        if actual:
            local_info[formal] = n.info[actual]
            if actual in n.values:
                local_vals[formal] = n.values[actual]
    for inner in fn.node:
        inner_attrs = {at.name: n.attrs[at.ref_attr_name] if at.ref_attr_name else helper.get_attribute_value(at) for at in inner.attribute}
        infer(inner, local_info, local_vals, inner_attrs, n.functions, n.scratch)
    for formal, actual in zip(fn.output, n.node.output):
        if actual:
            n.info[actual] = local_info[formal]


def _constant(n: _Node):
    t = n.a("value")
    arr = numpy_helper.to_array(t)
    n.put(0, dtype_name(t.data_type), arr.shape, arr if arr.size <= 16 else None)


def _shape(n: _Node):
    shape = n.ins[0][1]
    n.put(0, "int64", [len(shape)], np.array(shape, np.int64))


def _gather(n: _Node):
    d, i = n.ins[0][1], n.ins[1][1]
    axis = n.a("axis", 0) % len(d)
    value = np.take(n.vals[0], n.vals[1], axis=axis) if n.vals[0] is not None and n.vals[1] is not None else None
    n.same(d[:axis] + i + d[axis + 1:], value)


def _reshape(n: _Node):
    if n.vals[1] is None:
        raise ShapeError(f"{n.name}: Reshape to a shape that is not a constant")
    src = n.ins[0][1]
    shape = [int(x) for x in np.atleast_1d(n.vals[1])]
    shape = [src[k] if x == 0 and not n.a("allowzero", 0) else x for k, x in enumerate(shape)]
    if -1 in shape:
        known = int(np.prod([x for x in shape if x != -1]))
        shape[shape.index(-1)] = int(np.prod(src)) // max(known, 1)
    n.same(shape, None if n.vals[0] is None else n.vals[0].reshape(shape))


def _squeeze(n: _Node):
    src = list(n.ins[0][1])
    axes = [int(x) for x in np.atleast_1d(n.vals[1])] if len(n.ins) > 1 and n.vals[1] is not None else list(n.a("axes", []) or [])
    if n.op == "Unsqueeze":
        rank = len(src) + len(axes)
        for ax in sorted(x % rank for x in axes):
            src.insert(ax, 1)
        shape = src
    else:
        axes = [x % len(src) for x in axes] or [k for k, d in enumerate(src) if d == 1]
        shape = [d for k, d in enumerate(src) if k not in axes]
    n.same(shape, None if n.vals[0] is None else n.vals[0].reshape(shape))


def _concat(n: _Node):
    axis = n.a("axis") % len(n.ins[0][1])
    shape = list(n.ins[0][1])
    shape[axis] = sum(x[1][axis] for x in n.ins if x is not None)
    value = np.concatenate(n.vals, axis=axis) if all(v is not None for v in n.vals) else None
    n.same(shape, value)


def _gather_block_quantized(n: _Node):
    d, i = n.ins[0][1], n.ins[1][1]
    gaxis = n.a("gather_axis", 0) % len(d)
    qaxis = n.a("quantize_axis", len(d) - 1) % len(d)
    shape = list(d)
    if n.ins[0][0] == "uint8":
        shape[qaxis] *= 8 // n.a("bits", 4)
    n.put(0, n.ins[2][0], shape[:gaxis] + i + shape[gaxis + 1:])


def _cast(n: _Node):
    to = dtype_name(n.a("to"))
    n.put(0, to, n.ins[0][1], None if n.vals[0] is None else n.vals[0].astype(to))


_ARITH = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.floor_divide}
_COMPARE = {"Greater": np.greater, "Less": np.less, "Equal": np.equal, "GreaterOrEqual": np.greater_equal, "LessOrEqual": np.less_equal}


def _arith(n: _Node):
    value = _ARITH[n.op](n.vals[0], n.vals[1]) if n.vals[0] is not None and n.vals[1] is not None else None
    n.same(_broadcast(n.ins[0][1], n.ins[1][1]), value)


def _compare(n: _Node):
    value = _COMPARE[n.op](n.vals[0], n.vals[1]) if n.vals[0] is not None and n.vals[1] is not None else None
    n.put(0, "bool", _broadcast(n.ins[0][1], n.ins[1][1]), value)


def _elementwise(n: _Node):
    n.same(n.ins[0][1], n.vals[0])


def _split(n: _Node):
    shape = n.ins[0][1]
    axis = n.a("axis", 0) % len(shape)
    if len(n.ins) > 1 and n.ins[1] is not None:
        if n.vals[1] is None:
            raise ShapeError(f"{n.name}: Split sizes are not a constant")
        sizes = [int(x) for x in np.atleast_1d(n.vals[1])]
    else:
        sizes = [shape[axis] // len(n.outs)] * len(n.outs)
    for k, size in enumerate(sizes):
        n.put(k, n.ins[0][0], shape[:axis] + [size] + shape[axis + 1:])


def _reduce_sum(n: _Node):
    shape = n.ins[0][1]
    if len(n.ins) > 1 and n.ins[1] is not None:
        if n.vals[1] is None:
            raise ShapeError(f"{n.name}: ReduceSum axes are not a constant")
        axes = [int(x) % len(shape) for x in np.atleast_1d(n.vals[1])]
    else:
        axes = list(range(len(shape)))
    if n.a("keepdims", 1):
        n.same([1 if k in axes else d for k, d in enumerate(shape)])
    else:
        n.same([d for k, d in enumerate(shape) if k not in axes])


def _transpose(n: _Node):
    shape = n.ins[0][1]
    perm = n.a("perm") or list(reversed(range(len(shape))))
    n.same([shape[p] for p in perm])


def _matmul(n: _Node):
    x, w = n.ins[0][1], n.ins[1][1]
    if x[-1] != w[-2]:
        raise ShapeError(f"{n.name}: MatMul {x} × {w}")
    n.same(_broadcast(x[:-2], w[:-2]) + [x[-2], w[-1]])


def _matmul_nbits(n: _Node):
    x = n.ins[0][1]
    if x[-1] != n.a("K"):
        raise ShapeError(f"{n.name}: input last dimension {x[-1]} is not K={n.a('K')}")
    n.same(x[:-1] + [n.a("N")])


def _rms_norm(n: _Node):
    dtype, shape = n.ins[0]
    n.put(0, dtype, shape)
    n.put(1, "float32", shape[:-1] + [1])
    if n.op == "SkipSimplifiedLayerNormalization":
        n.put(2, "float32", shape[:-1] + [1])
        n.put(3, dtype, shape)


def _group_query_attention(n: _Node):
    q, past = n.ins[0][1], n.ins[3][1]
    heads = n.a("num_heads")
    B, S = q[0], q[1]
    n.same([B, S, heads * past[3]])
    n.put(1, n.ins[3][0], past)
    n.put(2, n.ins[4][0], n.ins[4][1])
    n.scratch.append((n.name, B * heads * S * past[2] * 4))


def _if(n: _Node):
    """E.g. LongRoPE's choice of short or long rotary caches by total length: a known condition picks
    the branch (the plan's length decides it); otherwise each output is bounded by both branches."""
    branches = [n.a("then_branch"), n.a("else_branch")]
    if n.vals[0] is not None:
        branches = [branches[0] if bool(np.asarray(n.vals[0]).reshape(-1)[0]) else branches[1]]
    results = []
    for g in branches:
        local_info, local_vals = dict(n.info), dict(n.values)
        for inner in g.node:
            infer(inner, local_info, local_vals, {at.name: helper.get_attribute_value(at) for at in inner.attribute}, n.functions, n.scratch)
        results.append([(local_info[o.name], local_vals.get(o.name)) for o in g.output])
    for k, outs_k in enumerate(zip(*results)):
        dtypes = {o[0][0] for o in outs_k}
        if len(dtypes) > 1:
            raise ShapeError(f"{n.name}: the branches of If give output {k} different types {sorted(dtypes)}")
        shape = [max(dims) for dims in zip(*[o[0][1] for o in outs_k])]  # an upper bound when both can run
        n.put(k, outs_k[0][0][0], shape, outs_k[0][1] if len(outs_k) == 1 else None)


RULES = {
    "Constant": _constant, "Shape": _shape, "Gather": _gather, "Reshape": _reshape, "Unsqueeze": _squeeze, "Squeeze": _squeeze,
    "Concat": _concat, "GatherBlockQuantized": _gather_block_quantized, "Cast": _cast,
    **dict.fromkeys(_ARITH, _arith), **dict.fromkeys(_COMPARE, _compare),
    **dict.fromkeys(("Sigmoid", "Identity", "Relu", "Tanh", "Neg", "Erf", "Softmax", "Gelu"), _elementwise), "Split": _split,
    "ReduceSum": _reduce_sum, "Transpose": _transpose, "MatMul": _matmul, "MatMulNBits": _matmul_nbits,
    "SimplifiedLayerNormalization": _rms_norm, "SkipSimplifiedLayerNormalization": _rms_norm,
    "GroupQueryAttention": _group_query_attention, "If": _if,
}


def infer(node, info: dict, values: dict, attrs: dict, functions: dict, scratch: list):
    """Sets info[output] = (dtype, shape) (and values[output] for small int tensors) for one node."""
    n = _Node(node, info, values, attrs, functions, scratch)
    if node.domain == DOMAIN:
        return _function(n)
    rule = RULES.get(node.op_type)
    if rule is None:
        raise ShapeError(f"{node.name}: no static shape rule for {node.domain or 'ai.onnx'}.{node.op_type}")
    rule(n)


def static_schedule(model, feeds: dict[str, tuple[str, list[int]]]):
    """Run shape inference at fixed input shapes. Returns (steps, info) where steps is a list of
    {node, op_type, device, inputs, outputs, scratch} in execution order and info maps every tensor
    (inputs, initializers, activations) to (dtype, shape)."""
    info = dict(feeds)
    for t in model.graph.initializer:
        info[t.name] = (dtype_name(t.data_type), list(t.dims))
    values: dict = {}
    functions = {f.name: f for f in model.functions}
    steps = []
    for n in model.graph.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        scratch: list = []
        infer(n, info, values, attrs, functions, scratch)
        steps.append({"node": n.name, "op_type": n.op_type, "device": "npu" if n.domain == DOMAIN else "cpu",
                      "inputs": [i for i in n.input if i], "outputs": [o for o in n.output if o],
                      "scratch": sum(b for _, b in scratch)})
    return steps, info
