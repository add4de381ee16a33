"""OpenVINO Gather-1/7/8, GatherND-5/8, GatherElements-6: spec examples, reference, runtime."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import xgather
from tests import ov_oracle
from tests import reference as ref
from tests.helpers import assert_same, check_everywhere, spec_path

SPEC = spec_path("openvino-gather-7.md")
ov = xgather.openvino
I = np.array  # noqa: E741


# Examples 1-5 of openvino-gather-7.md (the data as written there).
SPEC_EXAMPLES = [
    (0, 0, I([0, 0, 4]), I([1, 2, 3, 4, 5]), I([1, 1, 5])),
    (1, 1, I([[0, 0, 4], [4, 0, 0]]), I([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]),
     I([[1, 1, 5], [10, 6, 6]])),
    (2, 2, I([[[0, 0, 4], [4, 0, 0]], [[1, 2, 4], [4, 3, 2]]]),
     np.arange(1, 21).reshape(2, 2, 5), I([[[1, 1, 5], [10, 6, 6]], [[12, 13, 15], [20, 19, 18]]])),
    (1, 2, I([[1, 2, 4], [4, 3, 2]]), np.arange(1, 41).reshape(2, 1, 5, 4),
     I([[[[5, 6, 7, 8], [9, 10, 11, 12], [17, 18, 19, 20]]],
        [[[37, 38, 39, 40], [33, 34, 35, 36], [29, 30, 31, 32]]]])),
    (-1, 1, I([[0, 0, 4], [4, 0, 0]]), I([[1, 2, 3, 4, 5], [6, 7, 8, 9, 10]]),
     I([[1, 1, 5], [10, 6, 6]])),
]


@pytest.mark.parametrize("version", [7, 8])
@pytest.mark.parametrize("b, axis, idx, data, want", SPEC_EXAMPLES,
                         ids=[f"example{i + 1}" for i in range(5)])
def test_gather7_spec_examples(version, b, axis, idx, data, want):
    assert_same(ov.gather(data, idx, axis, b, version=version), want)
    assert_same(ov.gather(data, idx, np.array([axis]), b, version=version), want)


def test_gather8_out_of_range_is_zero_and_negative_wraps():
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([0, -1, 5, -4, -3])
    for version in (1, 7, 8):
        check_everywhere(lambda d, i, v=version: ov.gather(d, i, 0, version=v), data, idx,
                         lambda d, i: ref.gather(d, i, 0, oob="fill"))
    # The runtime agrees for Gather-8 (negative and out of range alike).
    assert_same(ov.gather(data, idx, 0), ov_oracle.run("Gather", 8, data, idx, axis=0))


def test_ir_layer_round_trip():
    text = SPEC.read_text()
    xml = text[text.index("<layer"):text.index("</layer>") + len("</layer>")]
    xml = xml.replace("<layer ...", '<layer id="7" name="gather7"')
    layer = ov.from_ir_layer(xml)
    assert (layer.type, layer.version, dict(layer.attrs)) == ("Gather", 7, {"batch_dims": 1})
    assert layer.inputs[:2] == ((2, 64, 128), (2, 32, 21)) and layer.output == (2, 32, 21, 128)
    rng = np.random.default_rng(0)
    data = rng.standard_normal((2, 64, 128)).astype(np.float32)
    idx = rng.integers(0, 64, (2, 32, 21)).astype(np.int32)
    out = layer(data, idx, axis=1)  # the example's comment: axis = 1
    assert out.shape == layer.output
    assert_same(out, ref.gather(data, idx, 1, 1, oob="fill"))
    assert_same(out, ov_oracle.run("Gather", 7, data, idx, axis=1, batch_dims=1))
    again = ov.from_ir_layer(layer.to_xml())
    assert again == layer and again.id == "7" and again.name == "gather7"
    with pytest.raises(xgather.XGatherError, match=r"declares input port 1 dims \[2, 32, 21\]"):
        layer(data, idx[:, :5], axis=1)
    with pytest.raises(xgather.XGatherError, match="axis input"):
        layer(data, idx)


def test_ir_layer_versions_follow_the_opset():
    for kind, opset, version in [("Gather", "opset1", 1), ("Gather", "opset6", 1),
                                 ("Gather", "opset8", 8), ("Gather", "opset13", 8),
                                 ("GatherND", "opset5", 5), ("GatherND", "opset8", 8),
                                 ("GatherElements", "opset6", 6)]:
        data = '<data axis="0"/>' if kind == "GatherElements" else ""  # its axis is required
        layer = f'<layer type="{kind}" version="{opset}">{data}</layer>'
        assert ov.from_ir_layer(layer).version == version
    with pytest.raises(xgather.XGatherError, match="GatherND exists from opset5"):
        ov.from_ir_layer('<layer type="GatherND" version="opset4"/>')
    with pytest.raises(xgather.XGatherError, match="layer type must be one of"):
        ov.from_ir_layer('<layer type="Concat" version="opset1"/>')


def test_gather_nd_versions():
    data = np.arange(2 * 3 * 4 * 2, dtype=np.float32).reshape(2, 3, 4, 2)
    idx = np.array([[[1, 0], [2, -1]], [[0, 3], [-3, 1]], [[2, 2], [1, 1]]])  # (3, 2, 2)
    idx = np.broadcast_to(idx, (2, 3, 2, 2)).copy()
    assert_same(ov.gather_nd(data, idx[..., :1], 2), ref.gather_nd(data, idx[..., :1], 2))
    got5 = ov.gather_nd(data, idx[..., :1], 2, version=5)
    assert got5.shape == (6, 2, 2)
    assert_same(got5, ref.gather_nd(data, idx[..., :1], 2).reshape(6, 2, 2))
    pos = np.abs(idx[..., :1]) % 3
    for v in (5, 8):
        assert_same(ov.gather_nd(data, pos, 1, version=v),
                    ov_oracle.run("GatherND", v, data, pos, batch_dims=1))
        assert_same(ov.gather_nd(data, pos[..., :1, :], 2, version=v),
                    ov_oracle.run("GatherND", v, data, pos[..., :1, :], batch_dims=2))


def test_gather_nd_out_of_range_is_an_error_by_default():
    with pytest.raises(xgather.OutOfBoundsError,
                       match=r"openvino\.GatherND-8: index 4 at indices\[0, 1\]"):
        ov.gather_nd(np.zeros((3, 4)), np.array([[0, 4]]))


def test_gather_elements6():
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    idx = np.array([[0, -1, 2, 1], [3, 3, 0, -4], [1, 0, 0, 0], [2, 2, 2, 2], [0, 1, 2, 3]])
    check_everywhere(lambda d, i: ov.gather_elements(d, i, 0), data, idx[:, :4] % 3,
                     lambda d, i: ref.gather_elements(d, i, 0))
    idx1 = np.array([[0, -1, 3, 1, 1, 2]] * 3)
    assert_same(ov.gather_elements(data, idx1, 1), ref.gather_elements(data, idx1, 1))
    assert_same(ov.gather_elements(data, idx1, 1),
                ov_oracle.run("GatherElements", 6, data, idx1, axis=1))
    with pytest.raises(xgather.XGatherError, match=r"indices\.shape\[0\] must be == data"):
        ov.gather_elements(data, np.zeros((2, 4), np.int32), 1)


@pytest.mark.parametrize("itype", [np.int8, np.int16, np.uint8, np.uint16, np.uint32, np.int32,
                                   np.int64])
def test_any_integer_index_type(itype):
    data = np.arange(300, dtype=np.float32)
    idx = np.array([0, 1, 127, 5], itype)
    assert_same(ov.gather(data, idx, 0), ref.gather(data, idx, 0))
    assert_same(ov.gather(data, np.array([-1, 1], np.int8), 0), data[[299, 1]])


BAD = [
    ("batch-dims-gt-axis", lambda: ov.gather(np.zeros((2, 3, 4)), np.zeros((2, 3), np.int32),
                                             1, 2),
     r"^openvino\.Gather-8: batch_dims \(2\) must be <= axis \(1\) after normalisation "
     r"\[data\.shape=\(2, 3, 4\), indices\.shape=\(2, 3\)\]"),
    ("batch-dims-range", lambda: ov.gather(np.zeros((2, 3)), np.zeros((2, 3), np.int32), 1, -3),
     r"batch_dims must be in \[0, min\(data\.ndim, indices\.ndim\)\] = \[0, 2\] after a "
     r"negative one is normalised by indices\.ndim \(2\); got batch_dims=-3 \(normalised -1\)"),
    ("batch-mismatch", lambda: ov.gather(np.zeros((2, 3)), np.zeros((3, 2), np.int32), 1, 1),
     r"the first batch_dims=1 dimensions of data and indices must be equal; got \(2,\) and \(3,\)"),
    ("v1-batch-dims", lambda: ov.gather(np.zeros((2, 3)), np.zeros((2, 1), np.int32), 1, 1,
                                        version=1),
     r"openvino\.Gather-1: batch_dims exists from version 7 on"),
    ("bad-version", lambda: ov.gather(np.zeros(3), [0], 0, version=2),
     r"openvino\.Gather: version must be one of 1, 7, 8; got version=2"),
    ("axis-array-2", lambda: ov.gather(np.zeros((2, 3)), [0], np.array([0, 1])),
     r"axis must be an integer scalar or 1-element 1D array; got int64\[2\]"),
    ("float-axis", lambda: ov.gather(np.zeros((2, 3)), [0], np.float32(1)),
     r"axis must be an integer scalar or 1-element 1D array; got float32\[\]"),
    ("traced-axis", lambda: jax.jit(lambda a: ov.gather(np.zeros((2, 3)), [0], a))(1),
     r"openvino\.Gather-8: axis must be known at trace time"),
    ("nd-tuple-too-long", lambda: ov.gather_nd(np.zeros((2, 3)), np.zeros((1, 3), np.int32)),
     r"openvino\.GatherND-8: indices\.shape\[-1\] must be in \[1, data\.ndim - batch_dims = 2\]"),
    ("nd-float", lambda: ov.gather_nd(np.zeros((2, 3)), np.zeros((1, 2), np.float32)),
     r"openvino\.GatherND-8: indices must be int8 or int16 or .*; got float32"),
    ("elements-float", lambda: ov.gather_elements(np.zeros((2, 3)), np.zeros((2, 3)), 0),
     r"openvino\.GatherElements-6: indices must be .*; got float64"),
]


# batch_dims below -min(r, q): the spec text's range [-min(r, q), min(r, q)] rejects them,
# but the runtime normalises by indices.ndim first (b' = q + b) and checks b' after.
@pytest.mark.parametrize("version", [7, 8])
@pytest.mark.parametrize("dshape, ishape, axis, b", [
    ((2, 3), (1, 1, 1, 2), 1, -4),     # r=2, q=4: b' = 0
    ((2, 3), (2, 1, 1, 2), 1, -3),     # b' = 1 <= axis
    ((2, 3, 4), (2, 3, 1, 1, 2), 2, -4),  # r=3, q=5: b' = 1
    ((2, 3, 4), (2, 3, 1, 1, 2), -1, -3),  # b' = 2 = axis
], ids=["b'0", "b'1", "r3-b'1", "r3-b'2"])
def test_gather_batch_dims_normalised_by_indices_rank(version, dshape, ishape, axis, b):
    rng = np.random.default_rng(3)
    data = rng.standard_normal(dshape).astype(np.float32)
    s = dshape[axis]
    idx = rng.integers(0 if version == 7 else -s, s, ishape).astype(np.int32)
    want = ref.gather(data, idx, axis, len(ishape) + b)
    got = ov.gather(data, idx, axis, b, version=version)
    assert_same(got, want)
    assert_same(got, ov_oracle.run("Gather", version, data, idx, axis=axis, batch_dims=b))
    plan = xgather.explain(ov.gather, data, idx, axis, b, version=version)
    assert plan.batch_dims == len(ishape) + b


@pytest.mark.parametrize("call, pattern", [pytest.param(*b[1:], id=b[0]) for b in BAD])
def test_bad_inputs(call, pattern):
    with pytest.raises(xgather.XGatherError, match=pattern):
        call()


# -- Differential tests against the OpenVINO runtime -------------------------------------------

@st.composite
def gather_case(draw, version):
    r = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=r, max_size=r)))
    q = draw(st.integers(0 if version == 8 else 1, 3))
    b = 0 if version == 1 else draw(st.integers(0, min(r - 1, q)))
    axis = draw(st.integers(b, r - 1))
    # Batch dims of size 1 crash the CPU plugin (data (1, 3), indices (1, 2), axis 1,
    # batch_dims 1): keep them out of the oracle.
    shape = tuple(max(n, 2) if i < b else n for i, n in enumerate(shape))
    ishape = shape[:b] + tuple(draw(st.lists(st.integers(1, 3), min_size=q - b, max_size=q - b)))
    s = shape[axis]
    # Gather-8: the whole range and beyond. Gather-1/7 only [0, s-1]: the CPU plugin zeroes
    # negative indices and crashes on some out-of-range ones (those follow the reference
    # kernel, tested against tests/reference.py above).
    lo, hi = (-s - 2, s + 2) if version == 8 else (0, s)
    seed = draw(st.integers(0, 2**31 - 1))
    idx = np.random.default_rng(seed).integers(lo, hi, ishape).astype(np.int32)
    data = np.random.default_rng(seed + 1).standard_normal(shape).astype(np.float32)
    # Any b - q: the runtime normalises by indices.ndim first (below -min(r, q) included).
    neg_b = draw(st.booleans()) and version != 1
    return data, idx, axis - (r if draw(st.booleans()) else 0), (b - q if neg_b else b)


@pytest.mark.parametrize("version", [1, 7, 8])
@given(data=st.data())
def test_gather_vs_openvino(version, data):
    d, idx, axis, b = data.draw(gather_case(version))
    kw = {} if version == 1 else {"batch_dims": b}
    want = ov_oracle.run("Gather", version, d, idx, axis=axis, **kw)
    assert_same(ov.gather(d, idx, axis, b, version=version), want)


@st.composite
def gather_nd_case(draw):
    r = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=r, max_size=r)))
    b = draw(st.integers(0, r - 1))
    k = draw(st.integers(1, r - b))
    lead = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    seed = draw(st.integers(0, 2**31 - 1))
    g = np.random.default_rng(seed)
    bounds = np.array(shape[b:b + k])
    idx = np.floor(g.random(shape[:b] + lead + (k,)) * 2 * bounds).astype(np.int64) - bounds
    return g.standard_normal(shape).astype(np.float32), idx, b


@pytest.mark.parametrize("version", [5, 8])
@given(case=gather_nd_case())
def test_gather_nd_vs_openvino(version, case):
    d, idx, b = case
    want = ov_oracle.run("GatherND", version, d, idx, batch_dims=b)
    assert_same(ov.gather_nd(d, idx, b, version=version), want)


@given(st.data())
def test_gather_elements_vs_openvino(data):
    r = data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=r, max_size=r)))
    axis = data.draw(st.integers(-r, r - 1))
    ishape = tuple(data.draw(st.integers(1, 5)) if i == axis % r else n
                   for i, n in enumerate(shape))
    s = shape[axis]
    g = np.random.default_rng(data.draw(st.integers(0, 2**31 - 1)))
    idx = g.integers(-s, s, ishape).astype(np.int64)
    d = g.integers(-1000, 1000, shape).astype(np.int32)
    assert_same(ov.gather_elements(d, idx, axis),
                ov_oracle.run("GatherElements", 6, d, idx, axis=axis))


def test_spec_path_exists():
    assert SPEC.exists() and re.search(r"Gather-7", SPEC.read_text())


def _ov_cases():
    rng = np.random.default_rng(5)
    for version in (1, 7, 8):
        for dshape, ishape, axis, b in [((5,), (3,), 0, 0), ((4, 6), (2, 3), 1, 0),
                                         ((4, 6), (4, 3), -1, 1), ((4, 6), (4, 3), 1, -1),
                                         ((2, 3, 5), (2, 3, 4), 2, 2), ((2, 3, 5), (2, 4), 2, 1),
                                         ((2, 3, 5), (), 1, 0), ((2, 3, 5), (2,), 1, 1)]:
            if version == 1 and b:
                continue
            s = dshape[axis]
            idx = rng.integers(-s - 2, s + 2, ishape)
            yield pytest.param(version, rng.standard_normal(dshape).astype(np.float32), idx,
                               axis, b, id=f"v{version}-{dshape}-{ishape}-axis{axis}-b{b}")


@pytest.mark.parametrize("version, data, idx, axis, b", list(_ov_cases()))
def test_gather_case_table(version, data, idx, axis, b):
    bb = b + idx.ndim if b < 0 else b
    check_everywhere(lambda d, i: ov.gather(d, i, axis, b, version=version), data, idx,
                     lambda d, i: ref.gather(d, i, axis, bb, oob="fill"))


@pytest.mark.parametrize("version", [5, 8])
@pytest.mark.parametrize("b", [0, 1, 2])
def test_gather_nd_case_table(version, b):
    rng = np.random.default_rng(b)
    data = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    k = 4 - b - 1
    idx = np.stack([rng.integers(-data.shape[b + j], data.shape[b + j], (2, 3)[:b] + (2,))
                    for j in range(k)], -1)
    lead = int(np.prod(idx.shape[:b]))

    def want(d, i):
        out = ref.gather_nd(d, i, b)
        return out.reshape((lead,) + out.shape[b:]) if version == 5 and b else out

    check_everywhere(lambda d, i: ov.gather_nd(d, i, b, version=version), data, idx, want,
                     tuples=True)


@pytest.mark.parametrize("itype", ["int8", "int16", "uint8", "uint16", "uint32", "uint64"])
def test_index_types_as_the_runtime_takes_them(itype):
    """Gather and GatherND take any integer index type; GatherElements-6 only int32/int64."""
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    idx = np.array([[1, 0, 2], [0, 1, 1]], itype)
    with pytest.raises(Exception, match="int32 or int64"):  # the runtime refuses the node
        ov_oracle.run("GatherElements", 6, data, idx, axis=1)
    with pytest.raises(xgather.XGatherTypeError, match=rf"^openvino\.GatherElements-6: indices "
                                                       rf"must be int32 or int64; got {itype} "):
        ov.gather_elements(data, idx, 1)
    assert_same(ov.gather(data, idx, 1), ov_oracle.run("Gather", 8, data, idx, axis=1))
    pos = idx[:, :2, None] % 2
    assert_same(ov.gather_nd(data, pos), ov_oracle.run("GatherND", 8, data, pos))


BAD_IR = [
    ("not-xml", "<layer", r"^openvino\.from_ir_layer: layer must be well-formed XML"),
    ("not-a-layer", None, r"^openvino\.from_ir_layer: layer must be XML text or an "
                          r"xml\.etree\.ElementTree\.Element; got NoneType"),
    ("unknown-attribute", '<layer type="Gather" version="opset8"><data foo="1"/></layer>',
     r"^openvino\.Gather-8: unknown attribute in <data>; the layer takes batch_dims; got 'foo'"),
    ("axis-on-gather", '<layer type="Gather" version="opset8"><data axis="1"/></layer>',
     r"got 'axis'"),
    ("batch-dims-on-gather-1", '<layer type="Gather" version="opset1"><data batch_dims="0"/>'
                               '</layer>', r"^openvino\.Gather-1: .*the layer takes none"),
    ("batch-dims-on-elements", '<layer type="GatherElements" version="opset6">'
                               '<data axis="0" batch_dims="0"/></layer>', r"got 'batch_dims'"),
    ("elements-without-axis", '<layer type="GatherElements" version="opset6"/>',
     r"^openvino\.GatherElements-6: the <data> attribute axis is required"),
    ("attribute-not-int", '<layer type="GatherND" version="opset8"><data batch_dims="1.0"/>'
                          '</layer>', r"^openvino\.GatherND-8: attribute batch_dims must be an "
                                      r"integer \(ASCII digits, an optional minus sign\); "
                                      r"got '1\.0'"),
    # Python's int() reads these (10, 1, 1); OpenVINO's reader takes "1_0" as 1 and refuses
    # the others
    ("attribute-underscore", '<layer type="Gather" version="opset8"><data batch_dims="1_0"/>'
                             '</layer>', r"batch_dims must be an integer .*; got '1_0'"),
    ("attribute-plus", '<layer type="Gather" version="opset8"><data batch_dims="+1"/>'
                       '</layer>', r"batch_dims must be an integer .*; got '\+1'"),
    ("attribute-other-digits", '<layer type="Gather" version="opset8"><data batch_dims="\u0661"/>'
                               '</layer>', r"batch_dims must be an integer .*; got '\u0661'"),
    ("dim-not-int", '<layer type="GatherND" version="opset8"><input><port id="0"><dim>a</dim>'
                    '</port></input></layer>', r"a port's <dim> must be an integer .*; got 'a'"),
    ("two-outputs", '<layer type="GatherND" version="opset8"><output><port id="2"/>'
                    '<port id="3"/></output></layer>',
     r"^openvino\.GatherND-8: a gather layer has one output port; got 2 ports"),
    ("four-inputs", '<layer type="Gather" version="opset8"><input><port id="0"/><port id="1"/>'
                    '<port id="2"/><port id="3"/></input></layer>',
     r"^openvino\.Gather-8: the layer takes 2 or 3 input ports; got 4 ports"),
    ("axis-port-on-nd", '<layer type="GatherND" version="opset8"><input><port id="0"/>'
                        '<port id="1"/><port id="2"/></input></layer>',
     r"^openvino\.GatherND-8: the layer takes 2 input ports; got 3 ports"),
]


@pytest.mark.parametrize("layer, pattern", [pytest.param(*b[1:], id=b[0]) for b in BAD_IR])
def test_bad_ir_layers_are_errors(layer, pattern):
    with pytest.raises(xgather.XGatherError, match=pattern):
        ov.from_ir_layer(layer)


def test_ir_layer_without_axis_input_refuses_one():
    layer = ov.from_ir_layer('<layer type="GatherND" version="opset8"/>')
    with pytest.raises(xgather.XGatherError, match=r"^openvino\.GatherND-8: only a Gather "
                                                   r"layer takes an axis input \(port 2\); got 1"):
        layer(np.zeros((2, 3), np.float32), np.zeros((1, 1), np.int64), 1)


def test_ir_ports_without_dims_are_scalars_or_of_dynamic_rank():
    # OpenVINO writes both without <dim>: such a port declares nothing to check.
    openvino = pytest.importorskip("openvino")
    import openvino.opset8 as o8
    data = o8.parameter(openvino.PartialShape.dynamic(), openvino.Type.f32)
    idx = o8.parameter(openvino.PartialShape.dynamic(), openvino.Type.i32)
    model = openvino.Model([o8.gather_nd(data, idx)], [data, idx])
    xml = pytest.importorskip("tempfile").mkdtemp() + "/dynamic.xml"
    openvino.save_model(model, xml)
    root = __import__("xml.etree.ElementTree", fromlist=["parse"]).parse(xml).getroot()
    layer = ov.from_ir_layer(next(e for e in root.iter("layer") if e.get("type") == "GatherND"))
    assert layer.inputs == (None, None) and layer.output is None
    d, i = np.arange(12, dtype=np.float32).reshape(3, 4), np.array([[1], [-1]], np.int32)
    assert_same(layer(d, i), ref.gather_nd(d, i))
    assert ov.from_ir_layer(layer.to_xml()) == layer


def test_ir_axis_port_dims_are_checked():
    layer = ov.from_ir_layer('<layer type="Gather" version="opset8"><input><port id="0"/>'
                             '<port id="1"/><port id="2"><dim>1</dim></port></input></layer>')
    d, i = np.arange(12, dtype=np.float32).reshape(3, 4), np.array([2, -1], np.int32)
    assert_same(layer(d, i, np.array([1])), ref.gather(d, i, 1, oob="fill"))
    with pytest.raises(xgather.XGatherError, match=r"declares input port 2 dims \[1\]; got \[\]"):
        layer(d, i, 1)


def test_a_fill_value_without_a_mode_keeps_the_specs_zeros():
    # Gather-1/7/8 give zeros for an out-of-range index; fill_value is used in "fill" alone
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    for version in (1, 7, 8):
        got = ov.gather(data, np.array([5]), 1, version=version, fill_value=7.0)
        np.testing.assert_array_equal(got, [[0.0], [0.0]])
        got = ov.gather(data, np.array([5]), 1, version=version, fill_value=7.0, mode="fill")
        np.testing.assert_array_equal(got, [[7.0], [7.0]])
    with pytest.raises(xgather.XGatherError, match="fill_value"):  # checked all the same
        ov.gather(data.astype(np.int32), np.array([5]), 1, fill_value=0.5)
