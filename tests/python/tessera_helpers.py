"""Shared helpers for the Tessera end-to-end tests (raw HTTP, raw gRPC, data).

Imported by the test modules as ``import tessera_helpers as th``; pytest puts
this directory on ``sys.path`` (rootdir conftest, no package).

Raw HTTP goes through the standard library's ``http.client`` so the tests can
send malformed bodies and exact headers; ``requests`` is not a pinned
dependency of this suite.
"""

from __future__ import annotations

import http.client
import json
import struct
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

HTTP_TIMEOUT_S = 30


# --------------------------------------------------------------------------
# raw HTTP
# --------------------------------------------------------------------------


@dataclass
class RawResponse:
    status: int
    headers: Dict[str, str]  # lower-cased names
    body: bytes
    method: str = ""
    path: str = ""

    def json(self):
        return json.loads(self.body.decode("utf-8"))

    def header(self, name: str, default=None):
        return self.headers.get(name.lower(), default)

    def describe(self) -> str:
        return f"{self.method} {self.path} -> {self.status} {self.body[:300]!r}"


class RawHttp:
    """One-shot HTTP/1.1 requests against host:port (a fresh connection each)."""

    def __init__(self, url: str):
        host, _, port = url.rpartition(":")
        self.host, self.port = host, int(port)

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> RawResponse:
        if isinstance(body, str):
            body = body.encode("utf-8")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=HTTP_TIMEOUT_S)
        try:
            hdrs = dict(headers or {})
            if body is not None and "Content-Type" not in hdrs:
                hdrs["Content-Type"] = "application/json"
            conn.request(method, path, body=body, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
            return RawResponse(
                status=resp.status,
                headers={k.lower(): v for k, v in resp.getheaders()},
                body=data,
                method=method,
                path=path,
            )
        finally:
            conn.close()

    def get(self, path: str, **kw) -> RawResponse:
        return self.request("GET", path, **kw)

    def post(self, path: str, body=None, **kw) -> RawResponse:
        return self.request("POST", path, body=b"" if body is None else body, **kw)

    def post_json(self, path: str, obj, **kw) -> RawResponse:
        return self.post(path, json.dumps(obj), **kw)

    def post_binary(self, path: str, header_obj, tail: bytes, header_len: Optional[int] = None) -> RawResponse:
        """POST a JSON header followed by a binary tail (binary tensor extension)."""
        head = json.dumps(header_obj).encode("utf-8")
        hlen = len(head) if header_len is None else header_len
        return self.post(
            path,
            head + tail,
            headers={
                "Inference-Header-Content-Length": str(hlen),
                "Content-Type": "application/octet-stream",
            },
        )


def error_message(resp: RawResponse) -> str:
    """The body must be KServe's ``{"error": "<non-empty string>"}``; returns it."""
    try:
        obj = resp.json()
    except Exception as e:  # pragma: no cover - assertion message only
        raise AssertionError(f"error body is not JSON ({e}): {resp.describe()}")
    assert isinstance(obj, dict) and isinstance(obj.get("error"), str), f"not an error object: {resp.describe()}"
    assert obj["error"].strip(), f"empty error message: {resp.describe()}"
    return obj["error"]


def assert_error(resp: RawResponse, statuses, *substrings: str, any_of: Sequence[str] = ()) -> str:
    """Check status (an int or a collection of ints), the JSON error body and
    that the lower-cased message contains every substring and (if given) at
    least one of ``any_of``. Returns the message."""
    allowed = {statuses} if isinstance(statuses, int) else set(statuses)
    assert resp.status in allowed, f"expected HTTP {sorted(allowed)}, got {resp.describe()}"
    msg = error_message(resp)
    low = msg.lower()
    for s in substrings:
        assert s.lower() in low, f"error message lacks {s!r}: {msg!r}"
    if any_of:
        assert any(s.lower() in low for s in any_of), f"error message lacks any of {list(any_of)}: {msg!r}"
    return msg


def infer_path(model: str, version: str = "") -> str:
    return f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"


# --------------------------------------------------------------------------
# tensors on the wire
# --------------------------------------------------------------------------


def serialize_bytes(values: Iterable[bytes]) -> bytes:
    """BYTES wire form: per element a 4-byte little-endian length, then the bytes."""
    out = []
    for v in values:
        out.append(struct.pack("<I", len(v)))
        out.append(v)
    return b"".join(out)


def deserialize_bytes(buf: bytes) -> List[bytes]:
    out, off = [], 0
    while off < len(buf):
        (n,) = struct.unpack_from("<I", buf, off)
        off += 4
        out.append(bytes(buf[off : off + n]))
        off += n
    return out


def split_binary_response(resp: RawResponse) -> Tuple[dict, Dict[str, bytes]]:
    """Parse an /infer response that may carry a binary tail.

    Returns (json_header, {output_name: raw_bytes}) for outputs that came back
    binary; outputs sent as JSON keep their ``data`` in the header."""
    hlen = resp.header("Inference-Header-Content-Length")
    if hlen is None:
        return resp.json(), {}
    hlen = int(hlen)
    header = json.loads(resp.body[:hlen].decode("utf-8"))
    tail = resp.body[hlen:]
    raw, off = {}, 0
    for out in header.get("outputs", []):
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw[out["name"]] = tail[off : off + size]
            off += size
    assert off == len(tail), f"binary tail is {len(tail)} bytes but outputs declare {off}"
    return header, raw


def add_sub_inputs(batch: int = 1, seed: int = 0) -> Tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.uniform(-10, 10, size=(batch, 16)).astype(np.float32)
    b = rng.uniform(-10, 10, size=(batch, 16)).astype(np.float32)
    return a, b


def add_sub_json_request(a: np.ndarray, b: np.ndarray, **extra) -> dict:
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": list(a.shape), "datatype": "FP32", "data": a.flatten().tolist()},
            {"name": "INPUT1", "shape": list(b.shape), "datatype": "FP32", "data": b.flatten().tolist()},
        ]
    }
    req.update(extra)
    return req


def add_sub_binary_request(a: np.ndarray, b: np.ndarray, **extra) -> Tuple[dict, bytes]:
    ra, rb = a.astype("<f4").tobytes(), b.astype("<f4").tobytes()
    req = {
        "inputs": [
            {"name": "INPUT0", "shape": list(a.shape), "datatype": "FP32", "parameters": {"binary_data_size": len(ra)}},
            {"name": "INPUT1", "shape": list(b.shape), "datatype": "FP32", "parameters": {"binary_data_size": len(rb)}},
        ]
    }
    req.update(extra)
    return req, ra + rb


# --------------------------------------------------------------------------
# tritonclient shortcuts
# --------------------------------------------------------------------------


def http_inputs(module, arrays: Dict[str, np.ndarray], binary=True, datatype: Optional[str] = None):
    """Build tritonclient InferInput objects; ``binary`` is a bool or {name: bool}."""
    from tritonclient.utils import np_to_triton_dtype

    res = []
    for name, arr in arrays.items():
        dt = datatype or np_to_triton_dtype(arr.dtype)
        inp = module.InferInput(name, list(arr.shape), dt)
        if module.__name__.startswith("tritonclient.grpc"):
            inp.set_data_from_numpy(arr)
        else:
            b = binary.get(name, True) if isinstance(binary, dict) else binary
            inp.set_data_from_numpy(arr, binary_data=b)
        res.append(inp)
    return res


def add_sub_infer_inputs(module, a: np.ndarray, b: np.ndarray, binary=True):
    return http_inputs(module, {"INPUT0": a, "INPUT1": b}, binary=binary)


def grpc_status(exc) -> str:
    """tritonclient gRPC exceptions carry e.g. 'StatusCode.INVALID_ARGUMENT'."""
    return str(exc.status() or "")


def wait_until(pred: Callable[[], bool], timeout_s: float = 15.0, interval_s: float = 0.05, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if pred():
                return
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what or pred}")
        time.sleep(interval_s)


# --------------------------------------------------------------------------
# raw gRPC (typed contents etc.)
# --------------------------------------------------------------------------

# Triton datatype -> InferTensorContents field for typed contents.
TYPED_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


@dataclass
class GrpcStub:
    channel: object
    stub: object
    pb: object = field(repr=False)

    def close(self):
        self.channel.close()


def grpc_stub(url: str) -> GrpcStub:
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    channel = grpc.insecure_channel(
        url,
        options=[("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)],
    )
    return GrpcStub(channel, service_pb2_grpc.GRPCInferenceServiceStub(channel), service_pb2)


def typed_input(pb, name: str, datatype: str, shape, values) -> object:
    """An InferInputTensor whose data sits in the typed ``contents`` field."""
    t = pb.ModelInferRequest().InferInputTensor(name=name, datatype=datatype, shape=list(shape))
    getattr(t.contents, TYPED_FIELD[datatype]).extend(values)
    return t


def raw_output(resp, name: str, datatype: str, np_dtype=None):
    """Decode output ``name`` of a ModelInferResponse from raw_output_contents."""
    for i, out in enumerate(resp.outputs):
        if out.name == name:
            assert i < len(resp.raw_output_contents), "server answered without raw_output_contents"
            buf = resp.raw_output_contents[i]
            if datatype == "BYTES":
                return np.array(deserialize_bytes(buf), dtype=object).reshape(list(out.shape))
            return np.frombuffer(buf, dtype=np_dtype).reshape(list(out.shape))
    return None
