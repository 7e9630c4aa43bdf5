#!/usr/bin/env python3
"""CUDA shared memory round trip against a running `tessera serve` (scripts/gpu-smoke.sh, section 5).

    gpu_smoke_cuda_shm.py HTTP_URL [MODEL]      MODEL: mlp (INPUT0 [batch, 256] FP32 -> OUTPUT0 [batch, 10])

Needs only Python 3, numpy and libcudart.so.13 (torch's CUDA wheels put it on LD_LIBRARY_PATH),
reached through ctypes; no tritonclient, no network. It allocates the input and output on GPU 0
(cudaMalloc), fills the input (cudaMemcpy), registers both with the server by their IPC handles
(cudaIpcGetMemHandle, base64 in the JSON body, as tritonclient sends them), runs the model with
both tensors in CUDA memory, copies the output back and compares it with the same server's
answer to the same input sent as JSON. It checks status, unregisters, and exits 0 on success.
"""

import base64
import ctypes
import ctypes.util
import json
import sys
import urllib.error
import urllib.request

import numpy as np

BATCH, WIDTH, CLASSES = 4, 256, 10
H2D, D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


def cudart():
    for name in ("libcudart.so.13", ctypes.util.find_library("cudart")):
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                pass
    sys.exit("libcudart.so.13 not found (is LD_LIBRARY_PATH set to the CUDA wheels' lib directories?)")


CUDA = cudart()
CUDA.cudaGetErrorString.restype = ctypes.c_char_p


def check(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed: {CUDA.cudaGetErrorString(rc).decode()} ({rc})")


def device_buffer(nbytes):
    """cudaMalloc'd memory and its IPC handle (base64 of the 64-byte cudaIpcMemHandle_t)."""
    ptr, handle = ctypes.c_void_p(), (ctypes.c_char * 64)()
    check(CUDA.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cudaMalloc")
    check(CUDA.cudaIpcGetMemHandle(handle, ptr), "cudaIpcGetMemHandle")
    return ptr, base64.b64encode(bytes(handle)).decode()


def call(url, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read()
    except urllib.error.HTTPError as e:
        sys.exit(f"{path}: HTTP {e.code}: {e.read().decode(errors='replace')}")
    return json.loads(text) if text else None


def shm(region, nbytes):
    return {"shared_memory_region": region, "shared_memory_byte_size": nbytes}


def main():
    url = sys.argv[1].rstrip("/")
    model = sys.argv[2] if len(sys.argv) > 2 else "mlp"
    extensions = call(url, "/v2")["extensions"]
    if "cuda_shared_memory" not in extensions:
        sys.exit(f"cuda_shared_memory is not advertised: {extensions}")

    x = np.random.default_rng(5).standard_normal((BATCH, WIDTH)).astype(np.float32)
    in_bytes, out_bytes = x.nbytes, BATCH * CLASSES * 4
    plain = call(url, f"/v2/models/{model}/infer", {
        "inputs": [{"name": "INPUT0", "shape": [BATCH, WIDTH], "datatype": "FP32", "data": x.flatten().tolist()}],
    })
    expected = np.array(plain["outputs"][0]["data"], dtype=np.float32).reshape(BATCH, CLASSES)

    check(CUDA.cudaSetDevice(0), "cudaSetDevice")
    d_in, h_in = device_buffer(in_bytes)
    d_out, h_out = device_buffer(out_bytes)
    check(CUDA.cudaMemcpy(d_in, x.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(in_bytes), H2D), "cudaMemcpy in")
    for name, handle, nbytes in (("smoke_in", h_in, in_bytes), ("smoke_out", h_out, out_bytes)):
        call(url, f"/v2/cudasharedmemory/region/{name}/register",
             {"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": nbytes})
    status = {r["name"]: r for r in call(url, "/v2/cudasharedmemory/status")}
    assert status["smoke_in"] == {"name": "smoke_in", "device_id": 0, "byte_size": in_bytes}, status
    assert status["smoke_out"]["byte_size"] == out_bytes, status

    answer = call(url, f"/v2/models/{model}/infer", {
        "inputs": [{"name": "INPUT0", "shape": [BATCH, WIDTH], "datatype": "FP32",
                    "parameters": shm("smoke_in", in_bytes)}],
        "outputs": [{"name": "OUTPUT0", "parameters": shm("smoke_out", out_bytes)}],
    })
    out = answer["outputs"][0]
    assert "data" not in out and out["parameters"]["shared_memory_region"] == "smoke_out", out
    got = np.empty((BATCH, CLASSES), dtype=np.float32)
    check(CUDA.cudaMemcpy(got.ctypes.data_as(ctypes.c_void_p), d_out, ctypes.c_size_t(out_bytes), D2H), "cudaMemcpy out")

    call(url, "/v2/cudasharedmemory/unregister", {})
    assert call(url, "/v2/cudasharedmemory/status") == [], "regions left after unregister"
    check(CUDA.cudaFree(d_in), "cudaFree")
    check(CUDA.cudaFree(d_out), "cudaFree")
    err = float(np.max(np.abs(got - expected)))
    print(f"CUDA shared memory: {model} batch {BATCH}, max abs difference from the plain answer {err:.2e}")
    if not np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        sys.exit(f"outputs differ: got {got[0][:4]}, expected {expected[0][:4]}")


if __name__ == "__main__":
    main()
