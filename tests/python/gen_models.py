#!/usr/bin/env python3
"""Build the Triton-style model repository used by the Python end-to-end tests.

Usage:
    python gen_models.py OUTDIR [--only NAME ...] [--verify] [--list]

Every model is an ONNX graph made with the ``onnx`` helper API (no downloads);
random weights come from fixed numpy seeds, so two runs write byte-identical
files. The layout is a Triton model repository::

    OUTDIR/<model>/config.pbtxt        (absent for add_sub_auto)
    OUTDIR/<model>/<version>/model.onnx

``--only`` writes a subset (the benchmark uses ``--only mlp add_sub``).
``--verify`` loads every written model in onnxruntime (CPU), runs it on
known data and checks the outputs, and parses every config.pbtxt with the
real ``inference.ModelConfig`` proto from tritonclient; the deliberately
broken models must fail in the way they are meant to.

All fourteen Triton datatypes run through a plain ONNX ``Identity`` node in
onnxruntime 1.31.1 CPU (checked by ``--verify``), so no Cast pairs are
needed. BF16 has no numpy dtype; onnxruntime's Python API only reaches it
through ``OrtValue`` with an explicit ONNX element type, which ``--verify``
uses.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# ir_version 8 / opset 17 are old enough for any onnxruntime >= 1.14 and new
# enough for bfloat16 Identity (opset >= 13).
IR_VERSION = 8
OPSET = 17

# Triton datatype name -> (ONNX element type, config.pbtxt data_type).
DTYPES: Dict[str, tuple] = {
    "BOOL": (TensorProto.BOOL, "TYPE_BOOL"),
    "UINT8": (TensorProto.UINT8, "TYPE_UINT8"),
    "UINT16": (TensorProto.UINT16, "TYPE_UINT16"),
    "UINT32": (TensorProto.UINT32, "TYPE_UINT32"),
    "UINT64": (TensorProto.UINT64, "TYPE_UINT64"),
    "INT8": (TensorProto.INT8, "TYPE_INT8"),
    "INT16": (TensorProto.INT16, "TYPE_INT16"),
    "INT32": (TensorProto.INT32, "TYPE_INT32"),
    "INT64": (TensorProto.INT64, "TYPE_INT64"),
    "FP16": (TensorProto.FLOAT16, "TYPE_FP16"),
    "BF16": (TensorProto.BFLOAT16, "TYPE_BF16"),
    "FP32": (TensorProto.FLOAT, "TYPE_FP32"),
    "FP64": (TensorProto.DOUBLE, "TYPE_FP64"),
    "BYTES": (TensorProto.STRING, "TYPE_STRING"),
}

MLP_IN, MLP_HIDDEN, MLP_OUT = 256, 1024, 10
MLP_SEED = 20240611
MULTI_VERSIONS = (1, 2, 3)
CUSTOM_FILENAME = "net.onnx"
CUSTOM_SCALE = 2.0  # custom_filename computes OUTPUT0 = INPUT0 * 2

GARBAGE_ONNX = (b"this is not an ONNX model\x00\xff\xfe\x01" * 16) + bytes(range(256))


# --------------------------------------------------------------------------
# ONNX graph builders
# --------------------------------------------------------------------------


def _model(nodes, inputs, outputs, initializers=(), name="g") -> onnx.ModelProto:
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), initializer=list(initializers))
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="tessera-gen-models",
    )
    onnx.checker.check_model(model)
    return model


def onnx_add_sub() -> onnx.ModelProto:
    shape = ["batch", 16]
    return _model(
        [
            helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("INPUT1", TensorProto.FLOAT, shape),
        ],
        [
            helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("OUTPUT1", TensorProto.FLOAT, shape),
        ],
        name="add_sub",
    )


def onnx_identity(dtype: str) -> onnx.ModelProto:
    elem = DTYPES[dtype][0]
    return _model(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        [helper.make_tensor_value_info("INPUT0", elem, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", elem, ["batch", "n"])],
        name=f"identity_{dtype.lower()}",
    )


def mlp_weights() -> List[np.ndarray]:
    """W1, B1, W2, B2, W3, B3 from a fixed seed (small scale keeps values tame)."""
    rng = np.random.default_rng(MLP_SEED)
    dims = [(MLP_IN, MLP_HIDDEN), (MLP_HIDDEN, MLP_HIDDEN), (MLP_HIDDEN, MLP_OUT)]
    out = []
    for fan_in, fan_out in dims:
        w = (rng.standard_normal((fan_in, fan_out)) * (1.0 / np.sqrt(fan_in))).astype(np.float32)
        b = (rng.standard_normal((fan_out,)) * 0.01).astype(np.float32)
        out += [w, b]
    return out


def onnx_mlp() -> onnx.ModelProto:
    w1, b1, w2, b2, w3, b3 = mlp_weights()
    inits = [
        numpy_helper.from_array(w1, "W1"),
        numpy_helper.from_array(b1, "B1"),
        numpy_helper.from_array(w2, "W2"),
        numpy_helper.from_array(b2, "B2"),
        numpy_helper.from_array(w3, "W3"),
        numpy_helper.from_array(b3, "B3"),
    ]
    nodes = [
        helper.make_node("Gemm", ["INPUT0", "W1", "B1"], ["h1"]),
        helper.make_node("Relu", ["h1"], ["a1"]),
        helper.make_node("Gemm", ["a1", "W2", "B2"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["a2"]),
        helper.make_node("Gemm", ["a2", "W3", "B3"], ["OUTPUT0"]),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", MLP_IN])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", MLP_OUT])],
        inits,
        name="mlp",
    )


def onnx_add_const(value: float, width: int = 4) -> onnx.ModelProto:
    c = numpy_helper.from_array(np.full((width,), value, dtype=np.float32), "C")
    return _model(
        [helper.make_node("Add", ["INPUT0", "C"], ["OUTPUT0"])],
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])],
        [c],
        name="add_const",
    )


def onnx_scale(value: float, width: int = 4) -> onnx.ModelProto:
    c = numpy_helper.from_array(np.full((width,), value, dtype=np.float32), "C")
    return _model(
        [helper.make_node("Mul", ["INPUT0", "C"], ["OUTPUT0"])],
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])],
        [c],
        name="scale",
    )


# --------------------------------------------------------------------------
# config.pbtxt text
# --------------------------------------------------------------------------


def _tensor(name: str, data_type: str, dims: List[int]) -> str:
    return f'  {{\n    name: "{name}"\n    data_type: {data_type}\n    dims: [ {", ".join(str(d) for d in dims)} ]\n  }}'


def config_text(
    name: str,
    max_batch_size: int,
    inputs: List[tuple],
    outputs: List[tuple],
    extra: str = "",
) -> str:
    lines = [
        f'name: "{name}"',
        'backend: "onnxruntime"',
        f"max_batch_size: {max_batch_size}",
        "input [\n" + ",\n".join(_tensor(*t) for t in inputs) + "\n]",
        "output [\n" + ",\n".join(_tensor(*t) for t in outputs) + "\n]",
    ]
    if extra:
        lines.append(extra.strip())
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# model writers: each writes OUTDIR/<name>/...
# --------------------------------------------------------------------------


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, onnx.ModelProto):
        data = data.SerializeToString()
    if isinstance(data, str):
        data = data.encode("utf-8")
    path.write_bytes(data)


def write_add_sub(root: Path) -> None:
    d = root / "add_sub"
    _write(
        d / "config.pbtxt",
        config_text(
            "add_sub",
            8,
            [("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_FP32", [16])],
            [("OUTPUT0", "TYPE_FP32", [16]), ("OUTPUT1", "TYPE_FP32", [16])],
        ),
    )
    _write(d / "1" / "model.onnx", onnx_add_sub())


def write_add_sub_auto(root: Path) -> None:
    # No config.pbtxt on purpose: the server must auto-complete it from the
    # ONNX model (dynamic first dim => max_batch_size > 0, dims [16]).
    _write(root / "add_sub_auto" / "1" / "model.onnx", onnx_add_sub())


def _identity_writer(dtype: str) -> Callable[[Path], None]:
    def write(root: Path) -> None:
        name = f"identity_{dtype}"
        cfg_type = DTYPES[dtype][1]
        d = root / name
        _write(
            d / "config.pbtxt",
            config_text(name, 8, [("INPUT0", cfg_type, [-1])], [("OUTPUT0", cfg_type, [-1])]),
        )
        _write(d / "1" / "model.onnx", onnx_identity(dtype))

    return write


def write_raw_bytes(root: Path) -> None:
    # BYTES with dims [1]: the one shape Triton accepts for a raw binary BYTES input.
    d = root / "raw_bytes"
    _write(d / "config.pbtxt", config_text("raw_bytes", 8, [("INPUT0", "TYPE_STRING", [1])], [("OUTPUT0", "TYPE_STRING", [1])]))
    _write(
        d / "1" / "model.onnx",
        _model(
            [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
            [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["batch", 1])],
            [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["batch", 1])],
            name="raw_bytes",
        ),
    )


def write_variable_2d(root: Path) -> None:
    # Two variable dimensions: a raw binary request cannot deduce its shape.
    d = root / "variable_2d"
    _write(d / "config.pbtxt", config_text("variable_2d", 8, [("INPUT0", "TYPE_FP32", [-1, -1])], [("OUTPUT0", "TYPE_FP32", [-1, -1])]))
    _write(
        d / "1" / "model.onnx",
        _model(
            [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
            [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "a", "b"])],
            [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", "a", "b"])],
            name="variable_2d",
        ),
    )


CLASSIFIER_LABELS = ["cat", "dog", "bird", "fish"]


def write_classifier(root: Path) -> None:
    # An FP32 identity whose output has a label file: the classification extension's model.
    d = root / "classifier"
    config = config_text("classifier", 8, [("INPUT0", "TYPE_FP32", [-1])], [("OUTPUT0", "TYPE_FP32", [-1])])
    head, _, outputs = config.partition("output [")
    config = head + "output [" + outputs.replace("    dims: [ -1 ]\n", '    dims: [ -1 ]\n    label_filename: "labels.txt"\n', 1)
    _write(d / "config.pbtxt", config)
    _write(d / "labels.txt", "\n".join(CLASSIFIER_LABELS) + "\n")
    _write(d / "1" / "model.onnx", onnx_identity("FP32"))


def write_mlp(root: Path) -> None:
    d = root / "mlp"
    _write(
        d / "config.pbtxt",
        config_text("mlp", 32, [("INPUT0", "TYPE_FP32", [MLP_IN])], [("OUTPUT0", "TYPE_FP32", [MLP_OUT])]),
    )
    _write(d / "1" / "model.onnx", onnx_mlp())


def _multi_writer(name: str, policy: str) -> Callable[[Path], None]:
    def write(root: Path) -> None:
        d = root / name
        _write(
            d / "config.pbtxt",
            config_text(name, 8, [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])], policy),
        )
        for v in MULTI_VERSIONS:
            _write(d / str(v) / "model.onnx", onnx_add_const(float(v)))

    return write


def write_custom_filename(root: Path) -> None:
    d = root / "custom_filename"
    _write(
        d / "config.pbtxt",
        config_text(
            "custom_filename",
            8,
            [("INPUT0", "TYPE_FP32", [4])],
            [("OUTPUT0", "TYPE_FP32", [4])],
            f'default_model_filename: "{CUSTOM_FILENAME}"',
        ),
    )
    _write(d / "1" / CUSTOM_FILENAME, onnx_scale(CUSTOM_SCALE))


PREPROCESS_SCALE = 2.0  # preprocess computes OUTPUT0 = INPUT0 * 2 (width 16)


def write_preprocess(root: Path) -> None:
    """The ensemble example's first step: scales INPUT0 before add_sub sees it."""
    d = root / "preprocess"
    _write(
        d / "config.pbtxt",
        config_text("preprocess", 8, [("INPUT0", "TYPE_FP32", [16])], [("OUTPUT0", "TYPE_FP32", [16])]),
    )
    _write(d / "1" / "model.onnx", onnx_scale(PREPROCESS_SCALE, 16))


ENSEMBLE_CONFIG = """name: "ensemble_add_sub"
platform: "ensemble"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
ensemble_scheduling {
  step [
    {
      model_name: "preprocess"
      model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" }
      output_map { key: "OUTPUT0" value: "preprocessed" }
    },
    {
      model_name: "add_sub"
      model_version: -1
      input_map { key: "INPUT0" value: "preprocessed" }
      input_map { key: "INPUT1" value: "INPUT1" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" }
      output_map { key: "OUTPUT1" value: "OUTPUT1" }
    }
  ]
}
"""


def write_ensemble_add_sub(root: Path) -> None:
    """Triton's ensemble example: preprocess then add_sub; OUTPUT0 = 2*INPUT0 + INPUT1,
    OUTPUT1 = 2*INPUT0 - INPUT1. An ensemble has no model file: its version dir is empty."""
    d = root / "ensemble_add_sub"
    _write(d / "config.pbtxt", ENSEMBLE_CONFIG)
    (d / "1").mkdir(parents=True, exist_ok=True)


def write_add_sub_cached(root: Path) -> None:
    """add_sub with Triton's response cache turned on."""
    d = root / "add_sub_cached"
    _write(
        d / "config.pbtxt",
        config_text(
            "add_sub_cached",
            8,
            [("INPUT0", "TYPE_FP32", [16]), ("INPUT1", "TYPE_FP32", [16])],
            [("OUTPUT0", "TYPE_FP32", [16]), ("OUTPUT1", "TYPE_FP32", [16])],
            extra="response_cache { enable: true }",
        ),
    )
    _write(d / "1" / "model.onnx", onnx_add_sub())


LOAD_UNLOAD_ADD = 10.0  # load_unload computes OUTPUT0 = INPUT0 + 10


def write_load_unload(root: Path) -> None:
    # A model of its own for the load/unload tests, so unloading it cannot
    # disturb tests that use the other models.
    d = root / "load_unload"
    _write(
        d / "config.pbtxt",
        config_text("load_unload", 8, [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])]),
    )
    _write(d / "1" / "model.onnx", onnx_add_const(LOAD_UNLOAD_ADD))


BAD_CONFIG_TEXT = """name: "bad_config"
backend: "onnxruntime"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }
output [ this is { not valid protobuf text
"""


def write_bad_config(root: Path) -> None:
    d = root / "bad_config"
    _write(d / "config.pbtxt", BAD_CONFIG_TEXT)
    _write(d / "1" / "model.onnx", onnx_add_const(1.0))


def write_bad_onnx(root: Path) -> None:
    d = root / "bad_onnx"
    _write(
        d / "config.pbtxt",
        config_text("bad_onnx", 8, [("INPUT0", "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])]),
    )
    _write(d / "1" / "model.onnx", GARBAGE_ONNX)


WRONG_IO_INPUT = "INPUT_DOES_NOT_EXIST"


def write_wrong_io(root: Path) -> None:
    d = root / "wrong_io"
    _write(
        d / "config.pbtxt",
        config_text(
            "wrong_io", 8, [(WRONG_IO_INPUT, "TYPE_FP32", [4])], [("OUTPUT0", "TYPE_FP32", [4])]
        ),
    )
    _write(d / "1" / "model.onnx", onnx_add_const(1.0))


# Stateful models for the sequence batcher (tests/python/test_sequence.py). The
# graph keeps no state itself: the server feeds the previous step's state output
# back as the state input (implicit state), and fills the control inputs.
SEQUENCE_IDLE_US = 2_000_000


def onnx_simple_sequence() -> onnx.ModelProto:
    """Triton's ``simple_sequence`` accumulator: START resets, READY gates the update.

    acc = START ? INPUT : ACC_IN + INPUT; ACC_OUT = READY ? acc : ACC_IN; OUTPUT = ACC_OUT.
    """
    shape = ["batch", 1]
    i32 = lambda n: helper.make_tensor_value_info(n, TensorProto.INT32, shape)  # noqa: E731
    zero = numpy_helper.from_array(np.zeros((1,), dtype=np.int32), "ZERO")
    return _model(
        [
            helper.make_node("Add", ["ACC_IN", "INPUT"], ["SUM"]),
            helper.make_node("Greater", ["START", "ZERO"], ["IS_START"]),
            helper.make_node("Where", ["IS_START", "INPUT", "SUM"], ["ACC"]),
            helper.make_node("Greater", ["READY", "ZERO"], ["IS_READY"]),
            helper.make_node("Where", ["IS_READY", "ACC", "ACC_IN"], ["ACC_OUT"]),
            helper.make_node("Identity", ["ACC_OUT"], ["OUTPUT"]),
        ],
        [i32("INPUT"), i32("START"), i32("READY"), i32("ACC_IN")],
        [i32("OUTPUT"), i32("ACC_OUT")],
        [zero],
        name="simple_sequence",
    )


def write_simple_sequence(root: Path) -> None:
    d = root / "simple_sequence"
    extra = """
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] }
  ]
  state [ { input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
    cfg = config_text("simple_sequence", 8, [("INPUT", "TYPE_INT32", [1])], [("OUTPUT", "TYPE_INT32", [1])], extra)
    _write(d / "config.pbtxt", cfg)
    _write(d / "1" / "model.onnx", onnx_simple_sequence())


def onnx_sequence_oldest() -> onnx.ModelProto:
    """A running total in implicit state, with END and CORRID echoed back.

    OUTPUT = TOTAL_IN + INPUT = TOTAL_OUT; END_OUT = END; CORRID_OUT = CORRID.
    """
    shape = ["batch", 1]
    return _model(
        [
            helper.make_node("Add", ["TOTAL_IN", "INPUT"], ["TOTAL_OUT"]),
            helper.make_node("Identity", ["TOTAL_OUT"], ["OUTPUT"]),
            helper.make_node("Identity", ["END"], ["END_OUT"]),
            helper.make_node("Identity", ["CORRID"], ["CORRID_OUT"]),
        ],
        [
            helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("END", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("CORRID", TensorProto.UINT64, shape),
            helper.make_tensor_value_info("TOTAL_IN", TensorProto.FLOAT, shape),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("END_OUT", TensorProto.FLOAT, shape),
            helper.make_tensor_value_info("CORRID_OUT", TensorProto.UINT64, shape),
            helper.make_tensor_value_info("TOTAL_OUT", TensorProto.FLOAT, shape),
        ],
        name="sequence_oldest",
    )


def write_sequence_oldest(root: Path) -> None:
    d = root / "sequence_oldest"
    extra = f"""
sequence_batching {{
  max_sequence_idle_microseconds: {SEQUENCE_IDLE_US}
  oldest {{ max_candidate_sequences: 4 preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 2000 }}
  control_input [
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 }} ] }}
  ]
  state [ {{ input_name: "TOTAL_IN" output_name: "TOTAL_OUT" data_type: TYPE_FP32 dims: [ 1 ]
             initial_state [ {{ data_type: TYPE_FP32 dims: [ 1 ] zero_data: true name: "zeros" }} ] }} ]
}}
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
"""
    cfg = config_text(
        "sequence_oldest",
        4,
        [("INPUT", "TYPE_FP32", [1])],
        [("OUTPUT", "TYPE_FP32", [1]), ("END_OUT", "TYPE_FP32", [1]), ("CORRID_OUT", "TYPE_UINT64", [1])],
        extra,
    )
    _write(d / "config.pbtxt", cfg)
    _write(d / "1" / "model.onnx", onnx_sequence_oldest())


# Ragged batching (tests/python/test_ragged.py). Requests of different lengths batch
# together: the model sees their elements end to end as one 1-D tensor, plus batch inputs
# the server computes from the batch, and the server splits the outputs back per request.
RAGGED_DELAY_US = 200_000
RAGGED_SCALE = 2.0


def _ragged_sums():
    """Nodes and initializers computing SUMS[i], the sum of request i's elements of the flat
    RAGGED_INPUT, from INDEX = [0, c1, c1+c2, ...] (accumulated element counts with zero):
    cs = cumsum([0, x]); SUMS[i] = cs[INDEX[i+1]] - cs[INDEX[i]]. COLUMN reshapes to [-1, 1]."""
    i64 = lambda name, v: numpy_helper.from_array(np.array(v, dtype=np.int64), name)  # noqa: E731
    nodes = [
        helper.make_node("Concat", ["ZERO", "RAGGED_INPUT"], ["PADDED"], axis=0),
        helper.make_node("CumSum", ["PADDED", "AXIS"], ["CS"]),
        helper.make_node("Cast", ["INDEX"], ["IDX"], to=TensorProto.INT64),
        helper.make_node("Slice", ["IDX", "ONE", "BIG"], ["ENDS"]),
        helper.make_node("Slice", ["IDX", "NIL", "MINUS_ONE"], ["STARTS"]),
        helper.make_node("Gather", ["CS", "ENDS"], ["AT_END"], axis=0),
        helper.make_node("Gather", ["CS", "STARTS"], ["AT_START"], axis=0),
        helper.make_node("Sub", ["AT_END", "AT_START"], ["SUMS"]),
    ]
    initializers = [
        numpy_helper.from_array(np.zeros((1,), dtype=np.float32), "ZERO"),
        i64("AXIS", 0),
        i64("ONE", [1]),
        i64("NIL", [0]),
        i64("MINUS_ONE", [-1]),
        i64("BIG", [np.iinfo(np.int64).max]),
        i64("COLUMN", [-1, 1]),
    ]
    return nodes, initializers


def onnx_ragged_sum() -> onnx.ModelProto:
    """Per-request sums and means of a ragged input, and the input doubled.

    With x the requests' elements end to end, INDEX = [0, c1, c1+c2, ...] (accumulated element
    counts with zero) and COUNT = [c1, c2, ...]: cs = cumsum([0, x]); SUM[i] = cs[INDEX[i+1]] -
    cs[INDEX[i]]; MEAN = SUM / COUNT; DOUBLED = 2x (scattered back by each request's shape).
    """
    sums, initializers = _ragged_sums()
    return _model(
        sums + [
            helper.make_node("Div", ["SUMS", "COUNT"], ["MEANS"]),
            helper.make_node("Reshape", ["SUMS", "COLUMN"], ["SUM"]),
            helper.make_node("Reshape", ["MEANS", "COLUMN"], ["MEAN"]),
            helper.make_node("Mul", ["RAGGED_INPUT", "SCALE"], ["DOUBLED"]),
        ],
        [
            helper.make_tensor_value_info("RAGGED_INPUT", TensorProto.FLOAT, ["total"]),
            helper.make_tensor_value_info("INDEX", TensorProto.INT32, ["requests_plus_one"]),
            helper.make_tensor_value_info("COUNT", TensorProto.FLOAT, ["requests"]),
        ],
        [
            helper.make_tensor_value_info("SUM", TensorProto.FLOAT, ["requests", 1]),
            helper.make_tensor_value_info("MEAN", TensorProto.FLOAT, ["requests", 1]),
            helper.make_tensor_value_info("DOUBLED", TensorProto.FLOAT, ["total"]),
        ],
        [
            numpy_helper.from_array(np.array([RAGGED_SCALE], dtype=np.float32), "SCALE"),
        ] + initializers,
        name="ragged_sum",
    )


def write_ragged_sum(root: Path) -> None:
    d = root / "ragged_sum"
    cfg = f"""name: "ragged_sum"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [
  {{ name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "MEAN" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] }}
]
batch_input [
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "INDEX" data_type: TYPE_INT32 source_input: "RAGGED_INPUT" }},
  {{ kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }}
]
batch_output [ {{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "DOUBLED" source_input: "RAGGED_INPUT" }} ]
dynamic_batching {{ max_queue_delay_microseconds: {RAGGED_DELAY_US} }}
"""
    _write(d / "config.pbtxt", cfg)
    _write(d / "1" / "model.onnx", onnx_ragged_sum())


def onnx_ragged_strings() -> onnx.ModelProto:
    """A ragged input's elements as strings (TYPE_STRING), scattered back by each request's shape."""
    return _model(
        [helper.make_node("Cast", ["RAGGED_INPUT"], ["LABELS"], to=TensorProto.STRING)],
        [helper.make_tensor_value_info("RAGGED_INPUT", TensorProto.FLOAT, ["total"])],
        [helper.make_tensor_value_info("LABELS", TensorProto.STRING, ["total"])],
        name="ragged_strings",
    )


def write_ragged_strings(root: Path) -> None:
    d = root / "ragged_strings"
    cfg = f"""name: "ragged_strings"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "LABELS" data_type: TYPE_STRING dims: [ -1 ] }} ]
batch_output [ {{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "LABELS" source_input: "RAGGED_INPUT" }} ]
dynamic_batching {{ max_queue_delay_microseconds: {RAGGED_DELAY_US} }}
"""
    _write(d / "config.pbtxt", cfg)
    _write(d / "1" / "model.onnx", onnx_ragged_strings())


def onnx_ragged_sequence() -> onnx.ModelProto:
    """A running total per sequence of ragged requests: TOTAL = (START ? 0 : ACC_IN) + the sum
    of the request's elements (found with INDEX, as in ragged_sum); DOUBLED = 2x, scattered."""
    sums, initializers = _ragged_sums()
    return _model(
        sums + [
            helper.make_node("Reshape", ["SUMS", "COLUMN"], ["SUM"]),
            helper.make_node("Cast", ["START"], ["STARTF"], to=TensorProto.FLOAT),
            helper.make_node("Sub", ["ONEF", "STARTF"], ["KEEP"]),
            helper.make_node("Mul", ["ACC_IN", "KEEP"], ["CARRIED"]),
            helper.make_node("Add", ["CARRIED", "SUM"], ["TOTAL"]),
            helper.make_node("Identity", ["TOTAL"], ["ACC_OUT"]),
            helper.make_node("Mul", ["RAGGED_INPUT", "SCALE"], ["DOUBLED"]),
        ],
        [
            helper.make_tensor_value_info("RAGGED_INPUT", TensorProto.FLOAT, ["total"]),
            helper.make_tensor_value_info("INDEX", TensorProto.INT32, ["rows_plus_one"]),
            helper.make_tensor_value_info("START", TensorProto.INT32, ["rows", 1]),
            helper.make_tensor_value_info("ACC_IN", TensorProto.FLOAT, ["rows", 1]),
        ],
        [
            helper.make_tensor_value_info("TOTAL", TensorProto.FLOAT, ["rows", 1]),
            helper.make_tensor_value_info("DOUBLED", TensorProto.FLOAT, ["total"]),
            helper.make_tensor_value_info("ACC_OUT", TensorProto.FLOAT, ["rows", 1]),
        ],
        [
            numpy_helper.from_array(np.array([RAGGED_SCALE], dtype=np.float32), "SCALE"),
            numpy_helper.from_array(np.array([1.0], dtype=np.float32), "ONEF"),
        ] + initializers,
        name="ragged_sequence",
    )


def write_ragged_sequence(root: Path) -> None:
    d = root / "ragged_sequence"
    cfg = f"""name: "ragged_sequence"
backend: "onnxruntime"
max_batch_size: 8
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [
  {{ name: "TOTAL" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "DOUBLED" data_type: TYPE_FP32 dims: [ -1 ] }}
]
batch_input [
  {{ kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "INDEX" data_type: TYPE_INT32 source_input: "RAGGED_INPUT" }}
]
batch_output [ {{ kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "DOUBLED" source_input: "RAGGED_INPUT" }} ]
sequence_batching {{
  max_sequence_idle_microseconds: {SEQUENCE_IDLE_US}
  oldest {{ max_candidate_sequences: 4 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: {RAGGED_DELAY_US} }}
  control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
  state [ {{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
}}
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
    _write(d / "config.pbtxt", cfg)
    _write(d / "1" / "model.onnx", onnx_ragged_sequence())


def onnx_ragged_echo() -> onnx.ModelProto:
    """Triton's ``onnx_batch_input`` QA model (gen_qa_ragged_models.py), rebuilt: every input
    is 1-D; each output is its input repeated once per request (``BATCH_AND_SIZE_INPUT`` has
    one element per request), so every response holds the whole batch's tensor."""
    return _model(
        [
            helper.make_node("Reshape", ["RAGGED_INPUT", "ROW"], ["in_mat"]),
            helper.make_node("Reshape", ["BATCH_AND_SIZE_INPUT", "ROW"], ["bs_mat"]),
            helper.make_node("Reshape", ["BATCH_INPUT", "ROW"], ["batch_mat"]),
            helper.make_node("Div", ["BATCH_AND_SIZE_INPUT", "BATCH_AND_SIZE_INPUT"], ["ones"]),
            helper.make_node("Reshape", ["ones", "COLUMN"], ["expander"]),
            helper.make_node("MatMul", ["expander", "in_mat"], ["RAGGED_OUTPUT"]),
            helper.make_node("MatMul", ["expander", "bs_mat"], ["BATCH_AND_SIZE_OUTPUT"]),
            helper.make_node("MatMul", ["expander", "batch_mat"], ["BATCH_OUTPUT"]),
        ],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [f"{n.lower()}_len"])
            for n in ("RAGGED_INPUT", "BATCH_AND_SIZE_INPUT", "BATCH_INPUT")
        ],
        [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, ["requests", f"{n.lower()}_len"])
            for n in ("RAGGED_OUTPUT", "BATCH_AND_SIZE_OUTPUT", "BATCH_OUTPUT")
        ],
        [
            numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "ROW"),
            numpy_helper.from_array(np.array([-1, 1], dtype=np.int64), "COLUMN"),
        ],
        name="ragged_echo",
    )


# Triton's L0_batch_input test runs the same model with BATCH_INPUT computed each way.
RAGGED_ECHO_KINDS = {
    "ragged_batch_input": "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",
    "ragged_accumulated": "BATCH_ACCUMULATED_ELEMENT_COUNT",
    "ragged_max_count": "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE",
    "ragged_item_flatten": "BATCH_ITEM_SHAPE_FLATTEN",
}


def ragged_echo_config(name: str, kind: str) -> str:
    """Triton's ``onnx_batch_input`` config with BATCH_INPUT of ``kind``."""
    return f"""name: "{name}"
backend: "onnxruntime"
max_batch_size: 4
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "RAGGED_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "BATCH_AND_SIZE_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "BATCH_OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] }} ]
batch_input [
  {{ kind: BATCH_ELEMENT_COUNT target_name: "BATCH_AND_SIZE_INPUT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }},
  {{ kind: {kind} target_name: "BATCH_INPUT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }}
]
dynamic_batching {{ max_queue_delay_microseconds: {RAGGED_DELAY_US} }}
"""


def _ragged_echo_writer(name: str) -> Callable[[Path], None]:
    def write(root: Path) -> None:
        d = root / name
        _write(d / "config.pbtxt", ragged_echo_config(name, RAGGED_ECHO_KINDS[name]))
        _write(d / "1" / "model.onnx", onnx_ragged_echo())

    return write


def write_ragged_item_shape(root: Path) -> None:
    """Triton's ``onnx_batch_item`` QA model: BATCH_ITEM_SHAPE echoed back, one row per item."""
    d = root / "ragged_item_shape"
    cfg = f"""name: "ragged_item_shape"
backend: "onnxruntime"
max_batch_size: 4
input [ {{ name: "RAGGED_INPUT" data_type: TYPE_FP32 dims: [ -1, -1 ] allow_ragged_batch: true }} ]
output [ {{ name: "BATCH_OUTPUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
batch_input [ {{ kind: BATCH_ITEM_SHAPE target_name: "BATCH_INPUT" data_type: TYPE_FP32 source_input: "RAGGED_INPUT" }} ]
dynamic_batching {{ max_queue_delay_microseconds: {RAGGED_DELAY_US} }}
"""
    _write(d / "config.pbtxt", cfg)
    model = _model(
        [helper.make_node("Identity", ["BATCH_INPUT"], ["BATCH_OUTPUT"])],
        [
            helper.make_tensor_value_info("RAGGED_INPUT", TensorProto.FLOAT, ["total"]),
            helper.make_tensor_value_info("BATCH_INPUT", TensorProto.FLOAT, ["items", 2]),
        ],
        [helper.make_tensor_value_info("BATCH_OUTPUT", TensorProto.FLOAT, ["items", 2])],
        name="ragged_item_shape",
    )
    _write(d / "1" / "model.onnx", model)


IDENTITY_MODELS = [f"identity_{t}" for t in DTYPES]

WRITERS: Dict[str, Callable[[Path], None]] = {
    "add_sub": write_add_sub,
    "add_sub_auto": write_add_sub_auto,
    **{f"identity_{t}": _identity_writer(t) for t in DTYPES},
    "raw_bytes": write_raw_bytes,
    "classifier": write_classifier,
    "variable_2d": write_variable_2d,
    "mlp": write_mlp,
    "multi_version": _multi_writer("multi_version", "version_policy: { all: {} }"),
    "multi_latest": _multi_writer("multi_latest", ""),
    "custom_filename": write_custom_filename,
    "load_unload": write_load_unload,
    "preprocess": write_preprocess,
    "ensemble_add_sub": write_ensemble_add_sub,
    "add_sub_cached": write_add_sub_cached,
    "bad_config": write_bad_config,
    "bad_onnx": write_bad_onnx,
    "wrong_io": write_wrong_io,
    "simple_sequence": write_simple_sequence,
    "sequence_oldest": write_sequence_oldest,
    "ragged_sum": write_ragged_sum,
    "ragged_strings": write_ragged_strings,
    "ragged_sequence": write_ragged_sequence,
    **{name: _ragged_echo_writer(name) for name in RAGGED_ECHO_KINDS},
    "ragged_item_shape": write_ragged_item_shape,
}

BROKEN_MODELS = ("bad_config", "bad_onnx", "wrong_io")
GOOD_MODELS = tuple(n for n in WRITERS if n not in BROKEN_MODELS)


def generate(outdir, only=None) -> List[str]:
    """Write the repository (or the ``only`` subset) under ``outdir``; returns names written."""
    root = Path(outdir)
    names = list(only) if only else list(WRITERS)
    unknown = [n for n in names if n not in WRITERS]
    if unknown:
        raise SystemExit(f"unknown model(s): {', '.join(unknown)}; known: {', '.join(WRITERS)}")
    root.mkdir(parents=True, exist_ok=True)
    for name in names:
        target = root / name
        if target.exists():
            shutil.rmtree(target)
        WRITERS[name](root)
    return names


# --------------------------------------------------------------------------
# --verify: run every written model in onnxruntime and check its outputs
# --------------------------------------------------------------------------


def sample_for(dtype: str, shape=(2, 5)) -> np.ndarray:
    """Deterministic sample data that exercises the edges of each datatype."""
    n = int(np.prod(shape))
    if dtype == "BOOL":
        return (np.arange(n) % 3 == 0).reshape(shape)
    if dtype == "BYTES":
        pool = ["", "a", "héllo wörld", "漢字", "x" * 40, "\u00e9\u00e8", "tab\tnl\n", "0", "", "end"]
        return np.array([pool[i % len(pool)].encode("utf-8") for i in range(n)], dtype=object).reshape(shape)
    if dtype in ("FP16", "FP32", "FP64"):
        np_t = {"FP16": np.float16, "FP32": np.float32, "FP64": np.float64}[dtype]
        vals = np.linspace(-3.5, 3.5, n).astype(np_t)
        vals.flat[0] = np.finfo(np_t).max
        vals.flat[-1] = np.finfo(np_t).tiny
        return vals.reshape(shape)
    if dtype == "BF16":
        import ml_dtypes  # shipped with tritonclient

        return np.linspace(-3.5, 3.5, n).astype(ml_dtypes.bfloat16).reshape(shape)
    np_t = np.dtype(dtype.lower())
    info = np.iinfo(np_t)
    vals = np.arange(n, dtype=np.int64) - n // 2
    vals = np.clip(vals, info.min, info.max).astype(np_t)
    vals.flat[0] = info.min
    vals.flat[-1] = info.max
    return vals.reshape(shape)


def _session(path: Path):
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), sess_options=opts, providers=["CPUExecutionProvider"])


def run_bf16_identity(path: Path, x_bf16: np.ndarray) -> np.ndarray:
    """Run an identity_BF16 model; numpy has no bfloat16 so go through OrtValue."""
    import onnxruntime as ort

    import ml_dtypes

    x = np.ascontiguousarray(x_bf16.view(np.uint16))
    out = np.zeros_like(x)
    sess = _session(path)
    io = sess.io_binding()
    io.bind_ortvalue_input(
        "INPUT0", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(x, onnx_element_type=TensorProto.BFLOAT16)
    )
    io.bind_ortvalue_output(
        "OUTPUT0", ort.OrtValue.ortvalue_from_numpy_with_onnx_type(out, onnx_element_type=TensorProto.BFLOAT16)
    )
    sess.run_with_iobinding(io)
    return out.view(ml_dtypes.bfloat16)


def mlp_reference(x: np.ndarray) -> np.ndarray:
    """Plain numpy forward pass of the mlp (float64 accumulate)."""
    w1, b1, w2, b2, w3, b3 = (a.astype(np.float64) for a in mlp_weights())
    h = np.maximum(x.astype(np.float64) @ w1 + b1, 0)
    h = np.maximum(h @ w2 + b2, 0)
    return h @ w3 + b3


def parse_config(path: Path):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    cfg = model_config_pb2.ModelConfig()
    text_format.Parse(path.read_text(), cfg)
    return cfg


def _check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def verify_model(root: Path, name: str) -> str:
    d = root / name
    if name == "bad_config":
        try:
            parse_config(d / "config.pbtxt")
        except Exception as e:  # text_format.ParseError
            _check(_session(d / "1" / "model.onnx") is not None, "bad_config model.onnx must load")
            return f"config fails to parse as intended ({type(e).__name__})"
        raise AssertionError("bad_config/config.pbtxt unexpectedly parses")
    if name == "bad_onnx":
        parse_config(d / "config.pbtxt")
        try:
            _session(d / "1" / "model.onnx")
        except Exception as e:
            return f"model.onnx fails to load as intended ({type(e).__name__})"
        raise AssertionError("bad_onnx/1/model.onnx unexpectedly loads")
    if name == "wrong_io":
        cfg = parse_config(d / "config.pbtxt")
        sess = _session(d / "1" / "model.onnx")
        declared = {i.name for i in cfg.input}
        actual = {i.name for i in sess.get_inputs()}
        _check(not declared <= actual, "wrong_io config inputs must not match the model")
        return f"config declares {sorted(declared)}, model has {sorted(actual)}"

    if name == "ensemble_add_sub":
        cfg = parse_config(d / "config.pbtxt")
        steps = [s.model_name for s in cfg.ensemble_scheduling.step]
        _check(cfg.platform == "ensemble" and steps == ["preprocess", "add_sub"], f"{name}: steps {steps}")
        _check((d / "1").is_dir() and not any((d / "1").iterdir()), f"{name}: empty version dir")
        return "preprocess -> add_sub"

    if name != "add_sub_auto":
        cfg = parse_config(d / "config.pbtxt")
        _check(cfg.name == name, f"{name}: config name {cfg.name!r}")
        _check(cfg.backend == "onnxruntime", f"{name}: backend")
    else:
        _check(not (d / "config.pbtxt").exists(), "add_sub_auto must have no config.pbtxt")

    if name == "preprocess":
        x = np.arange(32, dtype=np.float32).reshape(2, 16)
        (y,) = _session(d / "1" / "model.onnx").run(None, {"INPUT0": x})
        _check(np.array_equal(y, x * PREPROCESS_SCALE), f"{name}: expected x*2")
        return f"computes x*{PREPROCESS_SCALE:g}"

    if name == "add_sub_cached":
        _check(cfg.response_cache.enable, f"{name}: response_cache")
        name = "add_sub"

    if name in ("add_sub", "add_sub_auto"):
        sess = _session(d / "1" / "model.onnx")
        _check([i.shape for i in sess.get_inputs()] == [["batch", 16]] * 2, f"{name}: input shapes")
        a = np.arange(48, dtype=np.float32).reshape(3, 16)
        b = np.full((3, 16), 0.5, dtype=np.float32)
        o0, o1 = sess.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
        _check(np.array_equal(o0, a + b) and np.array_equal(o1, a - b), f"{name}: wrong outputs")
        return "OUTPUT0=a+b, OUTPUT1=a-b ok (batch 3)"

    if name.startswith("identity_"):
        dtype = name[len("identity_"):]
        cfg = parse_config(d / "config.pbtxt")
        _check(cfg.max_batch_size == 8 and list(cfg.input[0].dims) == [-1], f"{name}: config dims")
        x = sample_for(dtype)
        if dtype == "BF16":
            y = run_bf16_identity(d / "1" / "model.onnx", x)
            _check(np.array_equal(y.view(np.uint16), x.view(np.uint16)), f"{name}: roundtrip")
        else:
            feed = x
            if dtype == "BYTES":  # onnxruntime wants str objects for tensor(string)
                feed = np.array([v.decode("utf-8") for v in x.flat], dtype=object).reshape(x.shape)
            (y,) = _session(d / "1" / "model.onnx").run(None, {"INPUT0": feed})
            _check(np.array_equal(y, feed) and y.shape == x.shape, f"{name}: roundtrip")
        return f"Identity roundtrip ok for {dtype} shape {list(x.shape)}"

    if name == "classifier":
        cfg = parse_config(d / "config.pbtxt")
        _check(cfg.output[0].label_filename == "labels.txt", f"{name}: labels")
        _check((d / "labels.txt").read_text().split() == CLASSIFIER_LABELS, f"{name}: label file")
        x = np.array([[0.1, 0.7, 0.2]], dtype=np.float32)
        (y,) = _session(d / "1" / "model.onnx").run(None, {"INPUT0": x})
        _check(np.array_equal(y, x), f"{name}: roundtrip")
        return "FP32 identity with labels.txt on OUTPUT0"

    if name == "raw_bytes":
        feed = np.array([["a\x00b"], ["c"]], dtype=object)
        (y,) = _session(d / "1" / "model.onnx").run(None, {"INPUT0": feed})
        _check(np.array_equal(y, feed), f"{name}: roundtrip")
        return "BYTES [1] identity roundtrip ok"

    if name == "variable_2d":
        x = np.arange(12, dtype=np.float32).reshape(1, 3, 4)
        (y,) = _session(d / "1" / "model.onnx").run(None, {"INPUT0": x})
        _check(np.array_equal(y, x), f"{name}: roundtrip")
        return "FP32 [-1, -1] identity roundtrip ok"

    if name == "mlp":
        path = d / "1" / "model.onnx"
        size = path.stat().st_size
        _check(5_000_000 < size < 5_600_000, f"mlp size {size}")
        x = np.random.default_rng(7).standard_normal((5, MLP_IN)).astype(np.float32)
        (y,) = _session(path).run(None, {"INPUT0": x})
        ref = mlp_reference(x)
        _check(y.shape == (5, MLP_OUT), "mlp output shape")
        _check(np.allclose(y, ref, rtol=1e-4, atol=1e-4), "mlp differs from numpy reference")
        _check(float(np.abs(y).max()) > 1e-3, "mlp output is degenerate")
        return f"size {size} B, matches numpy forward pass (max |y| {float(np.abs(y).max()):.3f})"

    if name in ("multi_version", "multi_latest"):
        cfg = parse_config(d / "config.pbtxt")
        want_all = name == "multi_version"
        _check(cfg.version_policy.HasField("all") == want_all, f"{name}: version policy")
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        for v in MULTI_VERSIONS:
            (y,) = _session(d / str(v) / "model.onnx").run(None, {"INPUT0": x})
            _check(np.array_equal(y, x + v), f"{name} v{v}: expected +{v}")
        return f"versions {list(MULTI_VERSIONS)} add their number; policy {'all' if want_all else 'default'}"

    if name == "custom_filename":
        cfg = parse_config(d / "config.pbtxt")
        _check(cfg.default_model_filename == CUSTOM_FILENAME, "custom_filename: default_model_filename")
        _check(not (d / "1" / "model.onnx").exists(), "custom_filename must not have model.onnx")
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        (y,) = _session(d / "1" / CUSTOM_FILENAME).run(None, {"INPUT0": x})
        _check(np.array_equal(y, x * CUSTOM_SCALE), "custom_filename: expected x*2")
        return f"1/{CUSTOM_FILENAME} computes x*{CUSTOM_SCALE:g}"

    if name == "load_unload":
        parse_config(d / "config.pbtxt")
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        (y,) = _session(d / "1" / "model.onnx").run(None, {"INPUT0": x})
        _check(np.array_equal(y, x + LOAD_UNLOAD_ADD), "load_unload: expected x+10")
        return f"computes x+{LOAD_UNLOAD_ADD:g}"

    if name == "simple_sequence":
        cfg = parse_config(d / "config.pbtxt")
        _check(cfg.HasField("sequence_batching"), "simple_sequence: sequence_batching")
        sess = _session(d / "1" / "model.onnx")
        col = lambda *v: np.array(v, dtype=np.int32).reshape(-1, 1)  # noqa: E731
        out, acc = sess.run(
            ["OUTPUT", "ACC_OUT"],
            {"INPUT": col(5, 5, 5), "START": col(1, 0, 0), "READY": col(1, 1, 0), "ACC_IN": col(9, 9, 9)},
        )
        _check(np.array_equal(out, col(5, 14, 9)) and np.array_equal(acc, out), "simple_sequence: accumulator")
        return "START resets, READY gates, ACC_OUT feeds ACC_IN"

    if name == "sequence_oldest":
        cfg = parse_config(d / "config.pbtxt")
        _check(cfg.sequence_batching.HasField("oldest"), "sequence_oldest: oldest strategy")
        sess = _session(d / "1" / "model.onnx")
        feeds = {
            "INPUT": np.array([[2.0]], dtype=np.float32),
            "END": np.array([[1.0]], dtype=np.float32),
            "CORRID": np.array([[77]], dtype=np.uint64),
            "TOTAL_IN": np.array([[3.0]], dtype=np.float32),
        }
        out, end, corrid, total = sess.run(["OUTPUT", "END_OUT", "CORRID_OUT", "TOTAL_OUT"], feeds)
        _check(out[0, 0] == 5.0 and total[0, 0] == 5.0 and end[0, 0] == 1.0 and corrid[0, 0] == 77, "sequence_oldest")
        return "running total in state; END and CORRID echoed"

    if name == "ragged_sum":
        cfg = parse_config(d / "config.pbtxt")
        _check(cfg.input[0].allow_ragged_batch and len(cfg.batch_input) == 2, f"{name}: ragged config")
        x = np.array([1, 2, 3, 10, 20], dtype=np.float32)  # requests of 3 and 2 elements
        feeds = {"RAGGED_INPUT": x, "INDEX": np.array([0, 3, 5], dtype=np.int32), "COUNT": np.array([3, 2], dtype=np.float32)}
        s_, m_, d_ = _session(d / "1" / "model.onnx").run(["SUM", "MEAN", "DOUBLED"], feeds)
        _check(np.array_equal(s_, [[6], [30]]) and np.array_equal(m_, [[2], [15]]), f"{name}: sums {s_} means {m_}")
        _check(np.array_equal(d_, x * RAGGED_SCALE), f"{name}: doubled")
        return "per-request SUM/MEAN from INDEX and COUNT; DOUBLED = 2x"

    if name == "ragged_sequence":
        x = np.array([1, 2, 3, 10, 20], dtype=np.float32)  # two sequences' requests of 3 and 2 elements
        feeds = {"RAGGED_INPUT": x, "INDEX": np.array([0, 3, 5], dtype=np.int32),
                 "START": np.array([[1], [0]], dtype=np.int32), "ACC_IN": np.array([[100], [7]], dtype=np.float32)}
        t_, d_, a_ = _session(d / "1" / "model.onnx").run(["TOTAL", "DOUBLED", "ACC_OUT"], feeds)
        _check(np.array_equal(t_, [[6], [37]]) and np.array_equal(a_, t_), f"{name}: totals {t_}")
        _check(np.array_equal(d_, x * RAGGED_SCALE), f"{name}: doubled")
        return "running totals of ragged requests per sequence; DOUBLED = 2x"

    if name == "ragged_strings":
        x = np.array([1.5, 2, 30], dtype=np.float32)
        (labels,) = _session(d / "1" / "model.onnx").run(["LABELS"], {"RAGGED_INPUT": x})
        _check([float(v) for v in labels] == x.tolist(), f"{name}: labels {labels}")
        return "the ragged input's elements as strings"

    if name in RAGGED_ECHO_KINDS:
        cfg = parse_config(d / "config.pbtxt")
        _check(cfg.batch_input[1].kind == cfg.batch_input[1].Kind.Value(RAGGED_ECHO_KINDS[name]), f"{name}: kind")
        feeds = {
            "RAGGED_INPUT": np.array([2, 4, 1], dtype=np.float32),
            "BATCH_AND_SIZE_INPUT": np.array([2, 1], dtype=np.float32),
            "BATCH_INPUT": np.array([0, 2, 3], dtype=np.float32),
        }
        r, b, a = _session(d / "1" / "model.onnx").run(None, feeds)
        _check(np.array_equal(r, [[2, 4, 1]] * 2) and np.array_equal(b, [[2, 1]] * 2), f"{name}: echo")
        _check(np.array_equal(a, [[0, 2, 3]] * 2), f"{name}: batch input echo")
        return f"each input echoed once per request; BATCH_INPUT is {RAGGED_ECHO_KINDS[name]}"

    if name == "ragged_item_shape":
        shapes = np.array([[1, 3], [2, 2]], dtype=np.float32)
        (y,) = _session(d / "1" / "model.onnx").run(None, {"RAGGED_INPUT": np.zeros(7, np.float32), "BATCH_INPUT": shapes})
        _check(np.array_equal(y, shapes), f"{name}: identity")
        return "BATCH_ITEM_SHAPE echoed"

    raise AssertionError(f"no verifier for {name}")


def verify(root: Path, names: List[str]) -> bool:
    ok = True
    for name in names:
        try:
            print(f"verify {name:16s} ok: {verify_model(root, name)}")
        except Exception as e:  # report all failures, then exit non-zero
            ok = False
            print(f"verify {name:16s} FAILED: {e}", file=sys.stderr)
    return ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("outdir", help="model repository directory to (re)write")
    p.add_argument("--only", nargs="+", metavar="NAME", help="generate only these models")
    p.add_argument("--verify", action="store_true", help="run every written model in onnxruntime and check it")
    p.add_argument("--list", action="store_true", help="print the known model names and exit")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(WRITERS))
        return 0
    names = generate(args.outdir, args.only)
    print(f"wrote {len(names)} model(s) to {os.path.abspath(args.outdir)}: {' '.join(names)}")
    if args.verify and not verify(Path(args.outdir), names):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
