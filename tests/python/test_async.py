"""asyncio tritonclient (HTTP via aiohttp, gRPC via grpc.aio).

pytest-asyncio is not a dependency of this suite, so each test runs its own
event loop with ``asyncio.run`` and creates the aio clients inside it.
"""

import asyncio

import numpy as np
import pytest
import tritonclient.grpc.aio as aiogrpc
import tritonclient.http.aio as aiohttpc
from tritonclient.utils import InferenceServerException

import gen_models
import tessera_helpers as th

pytestmark = pytest.mark.timeout(60)


def _check_add_sub(result, a, b):
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_aio_http_health_metadata_infer(aio_http_client_factory):
    async def body():
        async with aio_http_client_factory() as c:
            assert await c.is_server_live()
            assert await c.is_server_ready()
            assert await c.is_model_ready("add_sub")
            md = await c.get_server_metadata()
            assert "binary_tensor_data" in md["extensions"]
            mm = await c.get_model_metadata("mlp")
            assert mm["inputs"][0]["shape"] == [-1, 256]
            cfg = await c.get_model_config("add_sub")
            assert cfg["max_batch_size"] == 8
            a, b = th.add_sub_inputs(batch=2, seed=1)
            res = await c.infer("add_sub", th.add_sub_infer_inputs(aiohttpc, a, b), request_id="aio-1")
            _check_add_sub(res, a, b)
            assert res.get_response()["id"] == "aio-1"

    asyncio.run(body())


def test_aio_http_concurrent_infers(aio_http_client_factory, model_repo):
    async def body():
        async with aio_http_client_factory() as c:
            jobs, data = [], []
            for i in range(24):
                a, b = th.add_sub_inputs(batch=1 + i % 8, seed=600 + i)
                data.append((a, b))
                jobs.append(c.infer("add_sub", th.add_sub_infer_inputs(aiohttpc, a, b, binary=bool(i % 2)), request_id=str(i)))
            x = np.random.default_rng(3).standard_normal((4, 256)).astype(np.float32)
            jobs.append(c.infer("mlp", th.http_inputs(aiohttpc, {"INPUT0": x})))
            results = await asyncio.gather(*jobs)
            for i, ((a, b), res) in enumerate(zip(data, results)):
                assert res.get_response()["id"] == str(i)
                _check_add_sub(res, a, b)
            ref = gen_models._session(model_repo / "mlp" / "1" / "model.onnx").run(None, {"INPUT0": x})[0]
            np.testing.assert_allclose(results[-1].as_numpy("OUTPUT0"), ref, rtol=1e-4, atol=1e-5)

    asyncio.run(body())


def test_aio_http_error(aio_http_client_factory):
    async def body():
        async with aio_http_client_factory() as c:
            a, b = th.add_sub_inputs(seed=2)
            with pytest.raises(InferenceServerException) as ei:
                await c.infer("no_such_model_aio", th.add_sub_infer_inputs(aiohttpc, a, b))
            assert ei.value.status() == "404"
            assert "no_such_model_aio" in ei.value.message()

    asyncio.run(body())


def test_aio_grpc_health_metadata_infer(aio_grpc_client_factory):
    async def body():
        c = aio_grpc_client_factory()
        try:
            assert await c.is_server_live()
            assert await c.is_server_ready()
            assert await c.is_model_ready("add_sub")
            assert not await c.is_model_ready("bad_onnx")
            md = await c.get_server_metadata()
            assert "statistics" in md.extensions
            cfg = await c.get_model_config("mlp")
            assert cfg.config.max_batch_size == 32
            idx = await c.get_model_repository_index()
            assert any(m.name == "add_sub" and m.state == "READY" for m in idx.models)
            a, b = th.add_sub_inputs(batch=3, seed=4)
            res = await c.infer("add_sub", th.add_sub_infer_inputs(aiogrpc, a, b), request_id="g1")
            _check_add_sub(res, a, b)
            assert res.get_response().id == "g1"
        finally:
            await c.close()

    asyncio.run(body())


def test_aio_grpc_concurrent_infers(aio_grpc_client_factory):
    async def body():
        c = aio_grpc_client_factory()
        try:
            data = [th.add_sub_inputs(batch=1 + i % 8, seed=700 + i) for i in range(24)]
            results = await asyncio.gather(
                *[c.infer("add_sub", th.add_sub_infer_inputs(aiogrpc, a, b), request_id=str(i)) for i, (a, b) in enumerate(data)]
            )
            for i, ((a, b), res) in enumerate(zip(data, results)):
                assert res.get_response().id == str(i)
                _check_add_sub(res, a, b)
        finally:
            await c.close()

    asyncio.run(body())


def test_aio_grpc_stream_in_order(aio_grpc_client_factory):
    data = [th.add_sub_inputs(batch=1 + i % 4, seed=800 + i) for i in range(12)]

    async def requests():
        for i, (a, b) in enumerate(data):
            yield {"model_name": "add_sub", "inputs": th.add_sub_infer_inputs(aiogrpc, a, b), "request_id": f"st{i}"}

    async def body():
        c = aio_grpc_client_factory()
        try:
            got = []
            async for result, error in c.stream_infer(requests()):
                assert error is None, error
                got.append(result)
                if len(got) == len(data):
                    break
            assert [r.get_response().id for r in got] == [f"st{i}" for i in range(len(data))]
            for (a, b), res in zip(data, got):
                _check_add_sub(res, a, b)
        finally:
            await c.close()

    asyncio.run(body())


def test_aio_grpc_stream_error_in_band(aio_grpc_client_factory):
    a, b = th.add_sub_inputs(seed=9)

    async def requests():
        yield {"model_name": "no_such_model_stream", "inputs": th.add_sub_infer_inputs(aiogrpc, a, b), "request_id": "x"}
        yield {"model_name": "add_sub", "inputs": th.add_sub_infer_inputs(aiogrpc, a, b), "request_id": "y"}

    async def body():
        c = aio_grpc_client_factory()
        try:
            got = []
            async for result, error in c.stream_infer(requests()):
                got.append((result, error))
                if len(got) == 2:
                    break
            (r0, e0), (r1, e1) = got
            assert r0 is None and e0 is not None and "no_such_model_stream" in str(e0)
            assert e1 is None and r1.get_response().id == "y"
            _check_add_sub(r1, a, b)
        finally:
            await c.close()

    asyncio.run(body())
