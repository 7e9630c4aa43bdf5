"""Stateful models through the sequence batcher, driven the way Triton's documented sequence
examples drive them (``simple_http_sequence_sync_infer_client.py``,
``simple_grpc_sequence_sync_infer_client.py``, ``simple_grpc_sequence_stream_infer_client.py``):
two interleaved sequences over the ``simple_sequence`` accumulator, with numeric and string
correlation ids, over HTTP, gRPC and the gRPC stream. Errors carry Triton 2.51's status codes
and wording for requests without a correlation id, unknown, finished and idled-out sequences.
"""

import queue
import threading
import time
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

import gen_models

pytestmark = pytest.mark.timeout(120)

# The documented examples' values: the first sequence sends them, the second their negation.
VALUES = [11, 7, 5, 3, 2, 0, 1]
MODEL = "simple_sequence"


def _inputs(module, value: int):
    x = module.InferInput("INPUT", [1, 1], "INT32")
    x.set_data_from_numpy(np.array([[value]], dtype=np.int32))
    return [x]


def _expected(values):
    return list(np.cumsum(values))


def _run_interleaved(client, module, ids):
    """The examples' flow: both sequences step by step, START on the first, END on the last."""
    results = {ids[0]: [], ids[1]: []}
    for i, v in enumerate(VALUES):
        for seq, value in ((ids[0], v), (ids[1], -v)):
            r = client.infer(
                MODEL,
                _inputs(module, value),
                sequence_id=seq,
                sequence_start=(i == 0),
                sequence_end=(i == len(VALUES) - 1),
            )
            results[seq].append(int(r.as_numpy("OUTPUT")[0][0]))
    return results


@pytest.mark.parametrize("ids", [(1000, 1001), ("seq-a", "seq-b")], ids=["int_ids", "string_ids"])
def test_http_sync_sequences_accumulate(http_client, ids):
    results = _run_interleaved(http_client, httpclient, ids)
    assert results[ids[0]] == _expected(VALUES)
    assert results[ids[1]] == _expected([-v for v in VALUES])


@pytest.mark.parametrize("ids", [(2000, 2001), ("grpc-a", "grpc-b")], ids=["int_ids", "string_ids"])
def test_grpc_sync_sequences_accumulate(grpc_client, ids):
    results = _run_interleaved(grpc_client, grpcclient, ids)
    assert results[ids[0]] == _expected(VALUES)
    assert results[ids[1]] == _expected([-v for v in VALUES])


@pytest.mark.parametrize("ids", [(3000, 3001), ("stream-a", "stream-b")], ids=["int_ids", "string_ids"])
def test_grpc_stream_sequences_accumulate(fresh_grpc_client, ids):
    answers = queue.Queue()
    fresh_grpc_client.start_stream(callback=partial(lambda q, result, error: q.put((result, error)), answers))
    for i, v in enumerate(VALUES):
        for seq, value in ((ids[0], v), (ids[1], -v)):
            fresh_grpc_client.async_stream_infer(
                MODEL,
                _inputs(grpcclient, value),
                request_id=f"{seq}_{i}",
                sequence_id=seq,
                sequence_start=(i == 0),
                sequence_end=(i == len(VALUES) - 1),
            )
    results = {ids[0]: [], ids[1]: []}
    for _ in range(2 * len(VALUES)):
        result, error = answers.get(timeout=30)
        assert error is None, error
        seq_text, step = result.get_response().id.rsplit("_", 1)
        seq = ids[0] if seq_text == str(ids[0]) else ids[1]
        results[seq].append((int(step), int(result.as_numpy("OUTPUT")[0][0])))
    fresh_grpc_client.stop_stream()
    for seq, values in ((ids[0], VALUES), (ids[1], [-v for v in VALUES])):
        assert [out for _, out in sorted(results[seq])] == _expected(values)


def test_a_start_restarts_the_state(http_client):
    http_client.infer(MODEL, _inputs(httpclient, 40), sequence_id=4000, sequence_start=True)
    r = http_client.infer(MODEL, _inputs(httpclient, 2), sequence_id=4000, sequence_start=True)
    assert int(r.as_numpy("OUTPUT")[0][0]) == 2
    r = http_client.infer(MODEL, _inputs(httpclient, 3), sequence_id=4000, sequence_end=True)
    assert int(r.as_numpy("OUTPUT")[0][0]) == 5


# Triton 2.51's answers for the same requests, observed against tritonserver 2.51.0
# (scripts/setup-triton.sh) serving this repository's simple_sequence and sequence_oldest: HTTP 400
# and gRPC INVALID_ARGUMENT with these messages, also after an END and after the idle timeout.
NO_ID = "inference request to model 'simple_sequence' must specify a non-zero or non-empty correlation ID"
NEEDS_START = "inference request for sequence {id} to model '{model}' must specify the START flag on the first request of the sequence"
BATCH_ONE = "inference request to model 'simple_sequence' must specify batch-size 1 due to requirements of sequence batcher"


def _http_error(call):
    with pytest.raises(InferenceServerException) as ei:
        call()
    return ei.value.status(), ei.value.message()


def test_http_errors_are_tritons(http_client):
    assert _http_error(lambda: http_client.infer(MODEL, _inputs(httpclient, 1))) == ("400", NO_ID)
    status, msg = _http_error(lambda: http_client.infer(MODEL, _inputs(httpclient, 1), sequence_id=4100))
    assert (status, msg) == ("400", NEEDS_START.format(id=4100, model=MODEL))
    status, msg = _http_error(lambda: http_client.infer(MODEL, _inputs(httpclient, 1), sequence_id="never-started"))
    assert (status, msg) == ("400", NEEDS_START.format(id="never-started", model=MODEL))
    two = httpclient.InferInput("INPUT", [2, 1], "INT32")
    two.set_data_from_numpy(np.array([[1], [2]], dtype=np.int32))
    status, msg = _http_error(lambda: http_client.infer(MODEL, [two], sequence_id=4101, sequence_start=True))
    assert (status, msg) == ("400", BATCH_ONE)


def test_grpc_errors_are_tritons(grpc_client):
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer(MODEL, _inputs(grpcclient, 1))
    assert ei.value.status() == "StatusCode.INVALID_ARGUMENT" and ei.value.message() == NO_ID
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer(MODEL, _inputs(grpcclient, 1), sequence_id="nope")
    assert ei.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert ei.value.message() == NEEDS_START.format(id="nope", model=MODEL)


def test_a_finished_sequence_needs_a_new_start(http_client, grpc_client):
    http_client.infer(MODEL, _inputs(httpclient, 1), sequence_id=4200, sequence_start=True, sequence_end=True)
    status, msg = _http_error(lambda: http_client.infer(MODEL, _inputs(httpclient, 1), sequence_id=4200))
    assert (status, msg) == ("400", NEEDS_START.format(id=4200, model=MODEL))
    with pytest.raises(InferenceServerException) as ei:
        grpc_client.infer(MODEL, _inputs(grpcclient, 1), sequence_id=4200)
    assert ei.value.message() == NEEDS_START.format(id=4200, model=MODEL)


def _oldest_inputs(value: float):
    x = httpclient.InferInput("INPUT", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[value]], dtype=np.float32))
    return [x]


def test_an_idle_sequence_is_released(http_client):
    model = "sequence_oldest"
    http_client.infer(model, _oldest_inputs(1), sequence_id=4300, sequence_start=True)
    http_client.infer(model, _oldest_inputs(1), sequence_id=4300)
    time.sleep(gen_models.SEQUENCE_IDLE_US / 1e6 + 0.5)
    status, msg = _http_error(lambda: http_client.infer(model, _oldest_inputs(1), sequence_id=4300))
    assert (status, msg) == ("400", NEEDS_START.format(id=4300, model=model))


def test_oldest_batches_concurrent_sequences_with_their_controls_and_state(http_url, http_client):
    model = "sequence_oldest"
    steps = 6
    before = http_client.get_inference_statistics(model)["model_stats"][0]
    errors, outputs = [], {}

    def one_sequence(seq: int):
        client = httpclient.InferenceServerClient(http_url)
        try:
            got = []
            for i in range(steps):
                r = client.infer(
                    model, _oldest_inputs(seq % 100), sequence_id=seq, sequence_start=(i == 0), sequence_end=(i == steps - 1)
                )
                got.append(
                    (float(r.as_numpy("OUTPUT")[0][0]), float(r.as_numpy("END_OUT")[0][0]), int(r.as_numpy("CORRID_OUT")[0][0]))
                )
            outputs[seq] = got
        except Exception as e:  # reported below, with the sequence
            errors.append((seq, e))
        finally:
            client.close()

    # Six sequences over four candidates: two wait in the backlog until others end.
    seqs = [(1 << 40) + n for n in range(6)]
    threads = [threading.Thread(target=one_sequence, args=(s,)) for s in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    for seq in seqs:
        step = seq % 100
        assert outputs[seq] == [
            (float(step * (i + 1)), 1.0 if i == steps - 1 else 0.0, seq) for i in range(steps)
        ], seq
    after = http_client.get_inference_statistics(model)["model_stats"][0]
    ran = int(after["inference_count"]) - int(before["inference_count"])
    executions = int(after["execution_count"]) - int(before["execution_count"])
    assert ran == len(seqs) * steps
    assert executions < ran, f"requests of different sequences share executions ({executions} for {ran})"


def test_a_string_id_for_a_numeric_corrid_is_refused(http_client):
    # Triton 2.51 runs it with undefined CORRID bytes; Tessera refuses it (README says why).
    status, msg = _http_error(
        lambda: http_client.infer("sequence_oldest", _oldest_inputs(1), sequence_id="text", sequence_start=True)
    )
    assert status == "400" and "expects a numeric correlation ID" in msg, msg


def test_sequence_models_describe_their_batcher(http_client):
    cfg = http_client.get_model_config(MODEL)
    assert cfg["sequence_batching"]["control_input"][0]["name"] == "START"
    meta = http_client.get_model_metadata(MODEL)
    assert [i["name"] for i in meta["inputs"]] == ["INPUT"], "control and state inputs are the server's"
    assert [o["name"] for o in meta["outputs"]] == ["OUTPUT"]
