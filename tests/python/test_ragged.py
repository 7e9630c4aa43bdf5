"""Ragged batching through tritonclient, HTTP and gRPC: inputs marked ``allow_ragged_batch``
batch across requests of different lengths, the model sees their elements end to end with
``batch_input`` tensors the server computes, and outputs go back per request (by rows, or by
the source input's shape with ``BATCH_SCATTER_WITH_INPUT_SHAPE``). The models follow Triton's
QA ragged models (gen_qa_ragged_models.py) and L0_batch_input test; config errors carry
Triton 2.51's messages.
"""

import json
import threading

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import gen_models

pytestmark = pytest.mark.timeout(120)

CLIENTS = {"http": httpclient, "grpc": grpcclient}
# Different lengths, sent at once, so the batcher's delay gathers them into one batch.
LENGTHS = [3, 1, 5, 2]


def _client(protocol: str, server):
    module = CLIENTS[protocol]
    url = server.http_url if protocol == "http" else server.grpc_url
    return module, module.InferenceServerClient(url)


def _ragged_input(module, values: np.ndarray, name: str = "RAGGED_INPUT"):
    x = module.InferInput(name, list(values.shape), "FP32")
    x.set_data_from_numpy(values)
    return x


def _stats(client, model: str, protocol: str):
    stats = client.get_inference_statistics(model)
    if protocol == "grpc":
        s = stats.model_stats[0]
        return s.inference_count, s.execution_count
    s = stats["model_stats"][0]
    return s["inference_count"], s["execution_count"]


def _at_once(n: int, work, connect):
    """Runs ``work(i, client)`` on n threads, each with a client from ``connect()`` made
    beforehand, released together; returns results by i."""
    barrier = threading.Barrier(n)
    results, errors = {}, []

    def run(i):
        client = connect()
        try:
            barrier.wait(timeout=30)
            results[i] = work(i, client)
        except Exception as e:  # reported below
            errors.append((i, e))
        finally:
            client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    return results


def _values(i: int, length: int) -> np.ndarray:
    return (np.arange(length, dtype=np.float32) + 10 * (i + 1)).reshape(1, length)


def test_metadata_and_config_show_the_ragged_input_as_triton_does(http_client, grpc_client):
    meta = http_client.get_model_metadata("ragged_sum")
    assert [(i["name"], i["shape"]) for i in meta["inputs"]] == [("RAGGED_INPUT", [-1, -1])]
    assert [o["name"] for o in meta["outputs"]] == ["SUM", "MEAN", "DOUBLED"]
    config = http_client.get_model_config("ragged_sum")
    assert config["input"][0]["allow_ragged_batch"] is True
    kinds = [b["kind"] for b in config["batch_input"]]
    assert kinds == ["BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_ELEMENT_COUNT"]
    assert config["batch_output"][0]["target_name"] == ["DOUBLED"]
    grpc_config = grpc_client.get_model_config("ragged_sum").config
    assert grpc_config.batch_output[0].source_input == ["RAGGED_INPUT"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_one_request_gets_its_sum_mean_and_scattered_output(protocol, server):
    module, client = _client(protocol, server)
    try:
        x = _values(0, 4)
        r = client.infer("ragged_sum", [_ragged_input(module, x)])
        assert r.as_numpy("SUM").tolist() == [[float(x.sum())]]
        assert r.as_numpy("MEAN").tolist() == [[float(x.mean())]]
        doubled = r.as_numpy("DOUBLED")
        assert doubled.shape == (1, 4), "scattered with the input's shape"
        assert np.array_equal(doubled, x * gen_models.RAGGED_SCALE)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_requests_of_different_lengths_batch_together_and_each_gets_its_answer(protocol, server):
    module, probe = _client(protocol, server)
    before = _stats(probe, "ragged_sum", protocol)

    def one(i, client):
        x = _values(i, LENGTHS[i])
        r = client.infer("ragged_sum", [_ragged_input(module, x)])
        return x, r.as_numpy("SUM"), r.as_numpy("MEAN"), r.as_numpy("DOUBLED")

    connect = lambda: _client(protocol, server)[1]  # noqa: E731
    for i, (x, total, mean, doubled) in _at_once(len(LENGTHS), one, connect).items():
        assert total.tolist() == [[float(x.sum())]], f"request {i}"
        assert np.allclose(mean, [[x.mean()]]), f"request {i}"
        assert doubled.shape == x.shape and np.array_equal(doubled, x * gen_models.RAGGED_SCALE), f"request {i}"
    inferences, executions = (a - b for a, b in zip(_stats(probe, "ragged_sum", protocol), before))
    probe.close()
    assert inferences == len(LENGTHS)
    assert executions < inferences, f"{inferences} requests of lengths {LENGTHS} ran in {executions} executions"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_string_output_scatters_back_to_each_request(protocol, server):
    """TYPE_STRING outputs scatter like numeric ones: each request gets its own run of strings."""
    module = CLIENTS[protocol]

    def one(i, client):
        x = _values(i, LENGTHS[i]) + 0.5
        r = client.infer("ragged_strings", [_ragged_input(module, x)])
        return x, r.as_numpy("LABELS")

    connect = lambda: _client(protocol, server)[1]  # noqa: E731
    for i, (x, labels) in _at_once(len(LENGTHS), one, connect).items():
        assert labels.shape == x.shape, f"request {i}: {labels.shape}"
        assert [float(v) for v in labels.reshape(-1)] == x.reshape(-1).tolist(), f"request {i}: {labels}"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_ragged_requests_of_live_sequences_batch_together(protocol, server):
    """Ragged inputs under sequence_batching (Triton allows both): sequences whose requests
    have different lengths run in one batch, each keeps its own running total in its state and
    gets its own scattered output."""
    module, probe = _client(protocol, server)
    before = _stats(probe, "ragged_sequence", protocol)
    base = 7000 if protocol == "http" else 8000

    def one(i, client):
        totals = []
        for step in range(3):
            x = _values(i, LENGTHS[i] + step)
            r = client.infer("ragged_sequence", [_ragged_input(module, x)], sequence_id=base + i,
                             sequence_start=step == 0, sequence_end=step == 2)
            doubled = r.as_numpy("DOUBLED")
            assert doubled.shape == x.shape and np.array_equal(doubled, x * gen_models.RAGGED_SCALE)
            totals.append((float(x.sum()), float(r.as_numpy("TOTAL")[0][0])))
        return totals

    connect = lambda: _client(protocol, server)[1]  # noqa: E731
    for i, totals in _at_once(len(LENGTHS), one, connect).items():
        running = np.cumsum([sent for sent, _ in totals]).tolist()
        assert [got for _, got in totals] == running, f"sequence {i}: {totals}"
    inferences, executions = (a - b for a, b in zip(_stats(probe, "ragged_sequence", protocol), before))
    probe.close()
    assert inferences == 3 * len(LENGTHS)
    assert executions < inferences, f"{inferences} requests ran in {executions} executions"


def _expected_batch_input(kind: str, counts):
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO":
        return [0.0] + np.cumsum(counts).tolist()
    if kind == "BATCH_ACCUMULATED_ELEMENT_COUNT":
        return np.cumsum(counts).tolist()
    if kind == "BATCH_ITEM_SHAPE_FLATTEN":
        return list(counts)  # each request is one item of shape [count]
    assert kind == "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"
    return None  # said by its shape: one element per element of the longest request


@pytest.mark.parametrize("model", list(gen_models.RAGGED_ECHO_KINDS))
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batch_inputs_are_computed_from_the_batch(protocol, model, server):
    """Triton's L0_batch_input: each response echoes the whole batch's inputs, so the test
    sees what the model was fed: the requests end to end, their element counts, and
    BATCH_INPUT as the config's kind computes it."""
    kind = gen_models.RAGGED_ECHO_KINDS[model]
    module = CLIENTS[protocol]
    lengths = LENGTHS[:3]

    def one(i, client):
        x = _values(i, lengths[i])
        r = client.infer(model, [_ragged_input(module, x)])
        return x, r.as_numpy("RAGGED_OUTPUT"), r.as_numpy("BATCH_AND_SIZE_OUTPUT"), r.as_numpy("BATCH_OUTPUT")

    batched = False
    connect = lambda: _client(protocol, server)[1]  # noqa: E731
    for i, (x, ragged, sizes, batch) in _at_once(len(lengths), one, connect).items():
        assert ragged.shape[0] == sizes.shape[0] == batch.shape[0] == 1, "one row per request"
        counts = [int(c) for c in sizes[0]]
        batched |= len(counts) > 1
        assert ragged.shape[1] == sum(counts), f"request {i}: the batch end to end"
        offsets = np.cumsum([0] + counts)
        pieces = [ragged[0, offsets[k] : offsets[k + 1]].tolist() for k in range(len(counts))]
        assert x[0].tolist() in pieces, f"request {i}: its own elements are in the batch"
        expected = _expected_batch_input(kind, counts)
        if expected is None:
            assert batch.shape[1] == max(counts), f"request {i}: {batch.shape}"
        else:
            assert batch[0].tolist() == expected, f"request {i}: counts {counts}"
    assert batched, "requests sent together never shared a batch"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_batch_item_shape_gives_one_row_per_batch_item(protocol, server):
    module = CLIENTS[protocol]
    shapes = [(1, 2, 3), (2, 4, 1), (1, 1, 5)]

    def one(i, client):
        x = np.zeros(shapes[i], dtype=np.float32)
        return client.infer("ragged_item_shape", [_ragged_input(module, x)]).as_numpy("BATCH_OUTPUT")

    connect = lambda: _client(protocol, server)[1]  # noqa: E731
    for i, got in _at_once(len(shapes), one, connect).items():
        batch, *item = shapes[i]
        assert got.tolist() == [item] * batch, f"request {i} of shape {shapes[i]}"


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_ragged_request_still_needs_the_configured_rank(protocol, server):
    module, client = _client(protocol, server)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.infer("ragged_sum", [_ragged_input(module, np.zeros((1, 2, 2), dtype=np.float32))])
        assert "unexpected shape for input 'RAGGED_INPUT' for model 'ragged_sum'. Expected [-1,-1], got [1,2,2]" in str(
            e.value
        )
    finally:
        client.close()


# --------------------------------------------------------------------------
# configuration errors, on a server of their own (a failed load leaves the model unloaded)
# --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def config_server(launch_server):
    srv = launch_server("ragged-config", models=["ragged_batch_input", "variable_2d"])
    yield srv
    srv.stop()


def _config(**changes):
    text = gen_models.ragged_echo_config("ragged_batch_input", "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO")
    from google.protobuf import json_format, text_format
    from tritonclient.grpc import model_config_pb2

    parsed = text_format.Parse(text, model_config_pb2.ModelConfig())
    config = json_format.MessageToDict(parsed, preserving_proto_field_name=True)
    for path, value in changes.items():
        target = config
        *parents, last = path.split(".")
        for p in parents:
            target = target[int(p)] if p.isdigit() else target[p]
        target[int(last) if last.isdigit() else last] = value
    return json.dumps(config)


CONFIG_ERRORS = [
    # Triton core (ValidateBatchIO), " for <model>" appended.
    ({"batch_input.0.source_input": []}, "batch input kind 'BATCH_ELEMENT_COUNT' expects 1 source input, got 0 for ragged_batch_input"),
    ({"batch_input.1.data_type": "TYPE_INT64"}, "batch input data type must be TYPE_INT32 or TYPE_FP32 for ragged_batch_input"),
    ({"batch_input.1.source_input": ["NOPE"]}, "unknown source input name 'NOPE' for ragged_batch_input"),
    (
        {"batch_output": [{"target_name": ["MISSING"], "source_input": ["RAGGED_INPUT"]}]},
        "unknown target output name 'MISSING' for ragged_batch_input",
    ),
    (
        {"batch_output": [{"target_name": ["RAGGED_OUTPUT", "RAGGED_OUTPUT"], "source_input": ["RAGGED_INPUT"]}]},
        "target output name 'RAGGED_OUTPUT' can only be specified once for ragged_batch_input",
    ),
    # The onnxruntime backend: a ragged input cannot be optional.
    (
        {"input.0.optional": True},
        "unable to load model 'ragged_batch_input', configuration expects model provides input with shape [-1] for "
        "ragged input 'RAGGED_INPUT', which is not supported for optional input",
    ),
]


@pytest.mark.parametrize("changes,message", CONFIG_ERRORS, ids=[m.split(" for ")[0][:40] for _, m in CONFIG_ERRORS])
def test_bad_ragged_configs_fail_to_load_with_tritons_messages(config_server, changes, message):
    client = httpclient.InferenceServerClient(config_server.http_url)
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("ragged_batch_input", config=_config(**changes))
        assert message in str(e.value)
        assert e.value.status() == "400"
        # The config as written still loads.
        client.load_model("ragged_batch_input")
        assert client.is_model_ready("ragged_batch_input")
    finally:
        client.close()


def test_a_ragged_input_the_model_does_not_take_flat_is_refused(config_server):
    """The onnxruntime backend's check: the graph must take a ragged input as [-1]."""
    client = grpcclient.InferenceServerClient(config_server.grpc_url)
    config = {
        "name": "variable_2d",
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1, -1], "allow_ragged_batch": True}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1, -1]}],
    }
    try:
        with pytest.raises(InferenceServerException) as e:
            client.load_model("variable_2d", config=json.dumps(config))
        assert (
            "unable to load model 'variable_2d', configuration expects model provides input with shape [-1]  for "
            "ragged input 'INPUT0', model provides [-1,-1,-1]"
        ) in str(e.value)
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
    finally:
        client.close()


def test_ragged_batches_run_the_same_in_a_runner_process(launch_server):
    """Workers run models in a runner process per tenant and slice: the batch is formed there."""
    srv = launch_server("ragged-runner", extra_args=("--runner",), models=["ragged_sum"])
    try:
        def one(i, client):
            x = _values(i, LENGTHS[i])
            r = client.infer("ragged_sum", [_ragged_input(grpcclient, x)])
            return x, r.as_numpy("SUM"), r.as_numpy("DOUBLED")

        connect = lambda: grpcclient.InferenceServerClient(srv.grpc_url)  # noqa: E731
        for i, (x, total, doubled) in _at_once(len(LENGTHS), one, connect).items():
            assert total.tolist() == [[float(x.sum())]], f"request {i}"
            assert np.array_equal(doubled, x * gen_models.RAGGED_SCALE), f"request {i}"
        client = grpcclient.InferenceServerClient(srv.grpc_url)
        inferences, executions = _stats(client, "ragged_sum", "grpc")
        client.close()
        assert (inferences, executions < inferences) == (len(LENGTHS), True), (inferences, executions)
    finally:
        srv.stop()
