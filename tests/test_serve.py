"""onnxpy.serve: the KServe v2 / Triton HTTP protocol, tested on loopback with tritonclient and plain HTTP."""

from __future__ import annotations

import concurrent.futures
import gzip
import http.client as http_client
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("starlette", reason="the 'serve' extra (starlette, uvicorn) is not installed")
pytest.importorskip("uvicorn", reason="the 'serve' extra (starlette, uvicorn) is not installed")

import onnxpy  # noqa: E402
from onnxpy.models import default_input, default_model  # noqa: E402
from onnxpy.serve import ModelRepository, ServedModel, ServeConfig, ServerThread  # noqa: E402
from onnxpy.serve import protocol  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------------------ models
def string_model() -> onnx.ModelProto:
    nodes = [helper.make_node("StringNormalizer", ["text"], ["upper"], case_change_action="UPPER"),
             helper.make_node("Identity", ["text"], ["same"])]
    g = helper.make_graph(nodes, "strings", [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
                          [helper.make_tensor_value_info("upper", TensorProto.STRING, ["N"]),
                           helper.make_tensor_value_info("same", TensorProto.STRING, ["N"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def mixed_model() -> onnx.ModelProto:
    """INT64 + BOOL in; INT64, FP16 and FP64 out (datatype coverage, requested-output subsets)."""
    nodes = [helper.make_node("Cast", ["b"], ["bi"], to=TensorProto.INT64),
             helper.make_node("Mul", ["a", "bi"], ["masked"]),
             helper.make_node("Cast", ["a"], ["half"], to=TensorProto.FLOAT16),
             helper.make_node("Cast", ["a"], ["dbl"], to=TensorProto.DOUBLE)]
    g = helper.make_graph(nodes, "mixed",
                          [helper.make_tensor_value_info("a", TensorProto.INT64, ["N", 3]),
                           helper.make_tensor_value_info("b", TensorProto.BOOL, ["N", 3])],
                          [helper.make_tensor_value_info("masked", TensorProto.INT64, ["N", 3]),
                           helper.make_tensor_value_info("half", TensorProto.FLOAT16, ["N", 3]),
                           helper.make_tensor_value_info("dbl", TensorProto.DOUBLE, ["N", 3])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def scaled_model(scale: float) -> onnx.ModelProto:
    """y = x * scale (versions of one model differ by scale)."""
    g = helper.make_graph([helper.make_node("Mul", ["x", "s"], ["y"])], "scaled",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 2])],
                          [numpy_helper.from_array(np.array(scale, np.float32), "s")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def slow_model(n: int = 12, size: int = 1024) -> onnx.ModelProto:
    """A chain of size x size MatMul+Tanh (a few hundred ms per run)."""
    w = (np.random.default_rng(0).standard_normal((size, size)) / np.sqrt(size)).astype(np.float32)
    nodes = [helper.make_node("Expand", ["x", "shp"], ["h0"])]
    for i in range(n):
        nodes += [helper.make_node("MatMul", [f"h{i}", "W"], [f"m{i}"]),
                  helper.make_node("Tanh", [f"m{i}"], [f"h{i + 1}"])]
    nodes.append(helper.make_node("ReduceSum", [f"h{n}"], ["y"], keepdims=0))
    g = helper.make_graph(nodes, "slow", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
                          [numpy_helper.from_array(w, "W"),
                           numpy_helper.from_array(np.array([size, size], np.int64), "shp")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# ------------------------------------------------------------------------------------------------ server
MAX_BODY = 1 << 20


@pytest.fixture(scope="module")
def cnn_ref():
    return onnxpy.InferenceSession(default_model().SerializeToString())


@pytest.fixture(scope="module")
def server():
    repo = ModelRepository()
    cnn = default_model().SerializeToString()
    repo.add(ServedModel.load("cnn", "1", cnn, max_batch_size=8, max_queue_delay_ms=2))
    # batching that only fires once 4 rows are queued (long delay): deterministic batch of 4 requests
    repo.add(ServedModel.load("cnn_b4", "1", cnn, max_batch_size=4, max_queue_delay_ms=5000))
    repo.add(ServedModel.load("strings", "1", string_model().SerializeToString()))
    repo.add(ServedModel.load("mixed", "1", mixed_model().SerializeToString()))
    repo.add(ServedModel.load("scaled", "1", scaled_model(1.0).SerializeToString()))
    repo.add(ServedModel.load("scaled", "2", scaled_model(2.0).SerializeToString()))
    repo.add(ServedModel.load("slow", "1", slow_model().SerializeToString()))
    srv = ServerThread(repo, ServeConfig(workers=2, max_request_bytes=MAX_BODY, request_timeout_s=30.0)).start()
    yield srv
    srv.stop()


@pytest.fixture()
def client(server):
    import tritonclient.http as httpclient

    c = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}", connection_timeout=30, network_timeout=30)
    yield c
    c.close()


def http(server, method, path, body=None, headers=None):
    """(status, headers, body bytes) with plain urllib."""
    if isinstance(body, (dict, list)):
        body = json.dumps(body).encode()
    req = urllib.request.Request(server.url + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def error_of(status_body):
    status, _, body = status_body
    js = json.loads(body)
    assert set(js) == {"error"} and isinstance(js["error"], str) and js["error"], js
    return status, js["error"]


def metrics(server) -> str:
    status, _, body = http(server, "GET", "/metrics")
    assert status == 200
    return body.decode()


def metric_value(text: str, name: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        lab = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0]))
        if all(lab.get(k) == v for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# ------------------------------------------------------------------------------------------------ protocol unit
def test_protocol_roundtrip_binary_and_json():
    arrs = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([[True, False]]), np.arange(4, dtype=np.uint16),
            np.array([1.5, -2], np.float16), np.array(["a", "héllo", ""], dtype=object)]
    for a in arrs:
        for binary in (False, True):
            desc, raw = protocol.encode_output("t", a, binary)
            desc.setdefault("parameters", {})
            name, back, dt = protocol.decode_input(desc, raw)
            assert dt == protocol.v2_datatype(a.dtype)
            if dt == "BYTES":
                back = protocol.to_model_input(back, dt)
            np.testing.assert_array_equal(back, a)
            assert back.dtype == a.dtype and back.shape == a.shape
    assert protocol.onnx_type_to_v2("tensor(float)") == "FP32"
    assert protocol.onnx_type_to_v2("tensor(string)") == "BYTES"
    assert protocol.v2_shape(["N", 3, None, 4]) == [-1, 3, -1, 4]
    with pytest.raises(protocol.ProtocolError):
        protocol.deserialize_bytes_tensor(b"\x05\x00\x00\x00ab")


# ------------------------------------------------------------------------------------------------ tritonclient
def test_health_and_metadata_tritonclient(client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata()
    assert meta["name"] == "onnxpy" and "binary_tensor_data" in meta["extensions"]
    assert client.is_model_ready("cnn") and client.is_model_ready("scaled", "2")
    assert not client.is_model_ready("nope")
    m = client.get_model_metadata("cnn")
    assert m["inputs"] == [{"name": "image", "datatype": "FP32", "shape": [-1, 3, 32, 32]}]
    assert m["outputs"] == [{"name": "probabilities", "datatype": "FP32", "shape": [-1, 10]}]
    s = client.get_model_metadata("strings")
    assert s["inputs"][0]["datatype"] == "BYTES" and s["inputs"][0]["shape"] == [-1]
    mixed = client.get_model_metadata("mixed")
    assert [t["datatype"] for t in mixed["inputs"]] == ["INT64", "BOOL"]
    assert [t["datatype"] for t in mixed["outputs"]] == ["INT64", "FP16", "FP64"]
    assert client.get_model_metadata("scaled")["versions"] == ["1", "2"]
    cfg = client.get_model_config("cnn")
    assert cfg["max_batch_size"] == 8 and cfg["input"][0]["dims"] == [3, 32, 32]
    index = client.get_model_repository_index()
    assert {(e["name"], e["version"]) for e in index} >= {("cnn", "1"), ("scaled", "1"), ("scaled", "2")}


@pytest.mark.parametrize("binary", [True, False])
def test_infer_cnn_tritonclient(client, cnn_ref, binary):
    import tritonclient.http as httpclient

    x = default_input(3)["image"]
    inp = httpclient.InferInput("image", list(x.shape), "FP32")
    inp.set_data_from_numpy(x, binary_data=binary)
    out = httpclient.InferRequestedOutput("probabilities", binary_data=binary)
    res = client.infer("cnn", [inp], outputs=[out], request_id="req-7")
    got = res.as_numpy("probabilities")
    assert got.dtype == np.float32 and got.shape == (3, 10)
    np.testing.assert_allclose(got, cnn_ref.run(None, {"image": x})[0], rtol=1e-6, atol=1e-7)
    assert res.get_response()["id"] == "req-7"
    assert res.get_response()["model_version"] == "1"


def test_infer_bytes_tritonclient(client):
    import tritonclient.http as httpclient

    text = np.array(["hello", "wörld", ""], dtype=object)
    for binary in (True, False):
        inp = httpclient.InferInput("text", [3], "BYTES")
        inp.set_data_from_numpy(text, binary_data=binary)
        outs = [httpclient.InferRequestedOutput("upper", binary_data=binary),
                httpclient.InferRequestedOutput("same", binary_data=binary)]
        res = client.infer("strings", [inp], outputs=outs)
        upper = [x.decode() if isinstance(x, bytes) else x for x in res.as_numpy("upper")]
        same = [x.decode() if isinstance(x, bytes) else x for x in res.as_numpy("same")]
        assert upper == ["HELLO", "WÖRLD", ""] and same == list(text)


def test_requested_outputs_and_types_tritonclient(client):
    import tritonclient.http as httpclient

    a = np.array([[1, -2, 3], [4, 5, -6]], np.int64)
    b = np.array([[True, False, True], [False, True, True]])
    ia, ib = httpclient.InferInput("a", [2, 3], "INT64"), httpclient.InferInput("b", [2, 3], "BOOL")
    ia.set_data_from_numpy(a)
    ib.set_data_from_numpy(b, binary_data=False)
    res = client.infer("mixed", [ia, ib], outputs=[httpclient.InferRequestedOutput("half"),
                                                   httpclient.InferRequestedOutput("masked", binary_data=False)])
    names = [o["name"] for o in res.get_response()["outputs"]]
    assert names == ["half", "masked"]
    np.testing.assert_array_equal(res.as_numpy("masked"), a * b)
    assert res.as_numpy("half").dtype == np.float16
    np.testing.assert_array_equal(res.as_numpy("half"), a.astype(np.float16))
    assert res.as_numpy("dbl") is None
    res = client.infer("mixed", [ia, ib])  # no outputs requested: all of them
    assert [o["name"] for o in res.get_response()["outputs"]] == ["masked", "half", "dbl"]
    assert res.as_numpy("dbl").dtype == np.float64


def test_model_versions_tritonclient(client):
    import tritonclient.http as httpclient

    x = np.array([[1.0, -2.0]], np.float32)
    inp = httpclient.InferInput("x", [1, 2], "FP32")
    inp.set_data_from_numpy(x)
    for version, scale in (("1", 1.0), ("2", 2.0), ("", 2.0)):  # unversioned -> newest
        res = client.infer("scaled", [inp], model_version=version)
        np.testing.assert_array_equal(res.as_numpy("y"), x * scale)
        assert res.get_response()["model_version"] == (version or "2")


def test_errors_tritonclient(client):
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    x = np.zeros((1, 3, 32, 32), np.float64)
    inp = httpclient.InferInput("image", list(x.shape), "FP64")
    inp.set_data_from_numpy(x)
    with pytest.raises(InferenceServerException, match="datatype FP64, model expects FP32"):
        client.infer("cnn", [inp])
    inp = httpclient.InferInput("image", [1, 3, 32, 32], "FP32")
    inp.set_data_from_numpy(np.zeros((1, 3, 32, 32), np.float32))
    with pytest.raises(InferenceServerException, match="unknown model"):
        client.infer("nope", [inp])
    with pytest.raises(InferenceServerException, match="no version '9'"):
        client.infer("cnn", [inp], model_version="9")
    assert client.is_server_live()


def test_statistics_tritonclient(client):
    stats = client.get_inference_statistics("scaled")
    assert {s["version"] for s in stats["model_stats"]} == {"1", "2"}


# ------------------------------------------------------------------------------------------------ plain HTTP
def test_health_plain_http(server):
    assert http(server, "GET", "/v2/health/live")[0] == 200
    status, _, body = http(server, "GET", "/v2/health/ready")
    assert status == 200 and json.loads(body)["ready"] is True
    status, _, body = http(server, "GET", "/v2/models/scaled/versions/1")
    assert status == 200 and json.loads(body)["name"] == "scaled"
    assert http(server, "GET", "/v2/models/scaled/versions/1/ready")[0] == 200
    status, msg = error_of(http(server, "GET", "/v2/models/scaled/versions/3/ready"))
    assert status == 404 and "no version" in msg
    status, msg = error_of(http(server, "GET", "/v2/models/missing"))
    assert status == 404 and "unknown model 'missing'" in msg
    assert error_of(http(server, "GET", "/nothing/here"))[0] == 404
    assert error_of(http(server, "GET", "/v2/models/cnn/infer"))[0] == 405


def test_infer_json_plain_http(server):
    req = {"id": "1", "inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4.5]]}],
           "outputs": [{"name": "y"}]}
    status, headers, body = http(server, "POST", "/v2/models/scaled/versions/2/infer", req,
                                 {"Content-Type": "application/json"})
    assert status == 200, body
    js = json.loads(body)
    assert js["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 2], "data": [2, 4, 6, 9]}]
    assert js["model_name"] == "scaled" and js["model_version"] == "2" and js["id"] == "1"


def test_infer_binary_plain_http(server):
    """The binary tensor extension by hand: header length, binary_data_size, binary_data_output."""
    x = np.array([[1.5, -2.0], [0.25, 8.0]], np.float32)
    head = json.dumps({"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "parameters": {"binary_data_output": True}}).encode()
    status, headers, body = http(server, "POST", "/v2/models/scaled/versions/1/infer", head + x.tobytes(),
                                 {"Inference-Header-Content-Length": str(len(head)),
                                  "Content-Type": "application/octet-stream"})
    assert status == 200, body
    hl = int(headers["inference-header-content-length"])
    js = json.loads(body[:hl])
    out = js["outputs"][0]
    assert out["parameters"]["binary_data_size"] == 16 and "data" not in out
    np.testing.assert_array_equal(np.frombuffer(body[hl:], np.float32).reshape(out["shape"]), x)
    # BYTES binary: 4-byte little-endian length prefixes
    words = [b"ab", b"", b"xyz"]
    raw = b"".join(struct.pack("<I", len(w)) + w for w in words)
    head = json.dumps({"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES",
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "outputs": [{"name": "upper", "parameters": {"binary_data": True}}, {"name": "same"}]}).encode()
    status, headers, body = http(server, "POST", "/v2/models/strings/infer", head + raw,
                                 {"Inference-Header-Content-Length": str(len(head))})
    assert status == 200, body
    hl = int(headers["inference-header-content-length"])
    js = json.loads(body[:hl])
    assert js["outputs"][1]["data"] == ["ab", "", "xyz"]
    assert list(protocol.deserialize_bytes_tensor(body[hl:])) == [b"AB", b"", b"XYZ"]


def test_gzip_request(server):
    req = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
    status, _, body = http(server, "POST", "/v2/models/scaled/infer", gzip.compress(json.dumps(req).encode()),
                           {"Content-Encoding": "gzip"})
    assert status == 200 and json.loads(body)["outputs"][0]["data"] == [2, 4]


BAD_REQUESTS = [
    # (path, body, headers, status, message fragment)
    ("/v2/models/scaled/infer", b"{not json", {}, 400, "malformed JSON"),
    ("/v2/models/scaled/infer", b"[1, 2]", {}, 400, "JSON object"),
    ("/v2/models/scaled/infer", {"inputs": []}, {}, 400, "non-empty 'inputs'"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1]}]}, {},
     400, "needs 2"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]},
     {}, 400, "model expects [-1, 2]"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}, {},
     400, "shape [2]"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "INT32", "data": [1, 2]}]},
     {}, 400, "datatype INT32"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP99", "data": [1, 2]}]},
     {}, 400, "unsupported datatype"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                             "data": ["a", "b"]}]}, {}, 400, "must be numbers"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "z", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]},
     {}, 400, "no input 'z'"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}],
                                 "outputs": [{"name": "nope"}]}, {}, 400, "no output 'nope'"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32",
                                             "parameters": {"binary_data_size": 8}}]}, {}, 400, "past the end"),
    ("/v2/models/scaled/infer", {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]},
     {"Inference-Header-Content-Length": "9999"}, 400, "outside the body"),
    ("/v2/models/mixed/infer", {"inputs": [{"name": "a", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]}]},
     {}, 400, "expects input 'b'"),
    ("/v2/models/mixed/infer", {"inputs": [{"name": "a", "shape": [1, 3], "datatype": "INT64", "data": [1, 2, 3]},
                                           {"name": "b", "shape": [1, 3], "datatype": "BOOL", "data": [1, 0, 1]}]},
     {}, 400, "true/false"),
    ("/v2/models/nope/infer", {"inputs": []}, {}, 404, "unknown model"),
    ("/v2/models/scaled/infer", gzip.compress(b" " * (MAX_BODY + 10)), {"Content-Encoding": "gzip"}, 413,
     "exceeds the limit"),
    ("/v2/models/scaled/infer", b"{}", {"Content-Encoding": "br"}, 415, "Content-Encoding"),
]


@pytest.mark.parametrize("path,body,headers,status,fragment", BAD_REQUESTS,
                         ids=[f"{i}-{b[4]}" for i, b in enumerate(BAD_REQUESTS)])
def test_bad_requests_get_json_4xx(server, path, body, headers, status, fragment):
    got_status, msg = error_of(http(server, "POST", path, body, headers))
    assert got_status == status and fragment in msg, (got_status, msg)
    # the server keeps serving
    ok = http(server, "POST", "/v2/models/scaled/infer",
              {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]})
    assert ok[0] == 200


def test_oversized_body_413(server):
    """Declared too large: 413 before the body is sent; chunked (no length): 413 once the limit is crossed."""
    conn = http_client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.putrequest("POST", "/v2/models/scaled/infer")
    conn.putheader("Content-Length", str(MAX_BODY + 1))
    conn.endheaders()
    r = conn.getresponse()
    assert r.status == 413 and "exceeds the limit" in json.loads(r.read())["error"]
    conn.close()
    conn = http_client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    chunk = b" " * (64 << 10)
    conn.request("POST", "/v2/models/scaled/infer", body=iter([chunk] * (MAX_BODY // len(chunk) + 1)),
                 encode_chunked=True)
    r = conn.getresponse()
    assert r.status == 413 and "exceeds the limit" in json.loads(r.read())["error"]
    conn.close()
    assert http(server, "GET", "/v2/health/live")[0] == 200


def test_runtime_failure_is_4xx(server):
    """Shapes the metadata allows but the graph rejects (Mul broadcast) fail in session.run -> 400 JSON."""
    req = {"inputs": [{"name": "a", "shape": [2, 3], "datatype": "INT64", "data": [1] * 6},
                      {"name": "b", "shape": [1, 3], "datatype": "BOOL", "data": [True] * 3}]}
    # [2,3] * [1,3] broadcasts fine; make it fail instead with mismatched first dims 2 vs 3
    req["inputs"][1] = {"name": "b", "shape": [3, 3], "datatype": "BOOL", "data": [True] * 9}
    status, msg = error_of(http(server, "POST", "/v2/models/mixed/infer", req))
    assert status == 400 and "inference failed" in msg


def test_request_timeout(server):
    req = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}],
           "parameters": {"timeout": 1000}}  # microseconds, as in Triton
    status, msg = error_of(http(server, "POST", "/v2/models/slow/infer", req))
    assert status == 504 and "did not finish" in msg
    # without the tight timeout it completes
    del req["parameters"]
    status, _, body = http(server, "POST", "/v2/models/slow/infer", req)
    assert status == 200 and json.loads(body)["outputs"][0]["shape"] == []


def test_event_loop_not_blocked_by_inference(server):
    """While the slow model computes in a worker thread, other endpoints answer."""
    req = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.5]}]}
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(http, server, "POST", "/v2/models/slow/infer", req)
        seen_inflight = False
        while not fut.done():
            text = metrics(server)  # answered even while the worker is busy
            seen_inflight |= metric_value(text, "onnxpy_inference_inflight", model="slow") >= 1
            assert http(server, "GET", "/v2/health/live")[0] == 200
        assert fut.result()[0] == 200
    assert seen_inflight


def test_dynamic_batching_merges_and_splits(server, cnn_ref):
    """cnn_b4 waits up to 5 s for 4 rows: 4 concurrent single-image requests run as exactly one session call."""
    before = metric_value(metrics(server), "onnxpy_inference_executions_total", model="cnn_b4")
    xs = [default_input(1)["image"] * (i + 1) for i in range(4)]

    def one(x):
        req = {"inputs": [{"name": "image", "shape": list(x.shape), "datatype": "FP32",
                           "data": x.reshape(-1).tolist()}]}
        status, _, body = http(server, "POST", "/v2/models/cnn_b4/infer", req)
        assert status == 200, body
        out = json.loads(body)["outputs"][0]
        return np.array(out["data"], np.float32).reshape(out["shape"])

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(one, xs))
    for x, o in zip(xs, outs):
        np.testing.assert_allclose(o, cnn_ref.run(None, {"image": x})[0], rtol=1e-5, atol=1e-6)
    text = metrics(server)
    assert metric_value(text, "onnxpy_inference_executions_total", model="cnn_b4") == before + 1
    assert metric_value(text, "onnxpy_inference_batched_requests_total", model="cnn_b4") >= 4


def test_load_concurrent_clients(server, cnn_ref):
    """8 concurrent tritonclient clients x 25 requests (batch 1-2) on the batched CNN: no errors, exact results."""
    import tritonclient.http as httpclient

    n_clients, n_req = 8, 25
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1 + i % 2, 3, 32, 32)).astype(np.float32) for i in range(10)]
    expected = [cnn_ref.run(None, {"image": x})[0] for x in inputs]
    latencies, errors = [], []
    lock = threading.Lock()

    def worker(k):
        c = httpclient.InferenceServerClient(url=f"127.0.0.1:{server.port}", network_timeout=60)
        try:
            for j in range(n_req):
                i = (k * n_req + j) % len(inputs)
                inp = httpclient.InferInput("image", list(inputs[i].shape), "FP32")
                inp.set_data_from_numpy(inputs[i])
                t = time.perf_counter()
                try:
                    got = c.infer("cnn", [inp]).as_numpy("probabilities")
                    np.testing.assert_allclose(got, expected[i], rtol=1e-5, atol=1e-6)
                except Exception as e:  # noqa: BLE001 - collected and asserted below
                    with lock:
                        errors.append(repr(e))
                with lock:
                    latencies.append(time.perf_counter() - t)
        finally:
            c.close()

    before = metrics(server)
    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(n_clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    wall = time.perf_counter() - t0
    assert not errors, errors[:3]
    assert len(latencies) == n_clients * n_req
    lat = np.array(latencies) * 1e3
    after = metrics(server)
    execs = (metric_value(after, "onnxpy_inference_executions_total", model="cnn")
             - metric_value(before, "onnxpy_inference_executions_total", model="cnn"))
    ok = (metric_value(after, "onnxpy_inference_requests_total", model="cnn", status="success")
          - metric_value(before, "onnxpy_inference_requests_total", model="cnn", status="success"))
    assert ok == n_clients * n_req
    print(f"\nload test: {n_clients} clients x {n_req} requests in {wall:.2f} s = {len(lat) / wall:.1f} req/s, "
          f"latency p50 {np.percentile(lat, 50):.1f} ms p99 {np.percentile(lat, 99):.1f} ms, "
          f"{execs:.0f} session runs (mean batch {ok / max(execs, 1):.2f} requests)")


def test_metrics_endpoint(server):
    http(server, "POST", "/v2/models/scaled/infer", b"{bad")
    text = metrics(server)
    assert "# TYPE onnxpy_inference_requests_total counter" in text
    assert "# TYPE onnxpy_inference_request_duration_seconds histogram" in text
    assert "# TYPE onnxpy_inference_queue_depth gauge" in text
    assert metric_value(text, "onnxpy_inference_requests_total", model="scaled", status="failure") >= 1
    assert metric_value(text, "onnxpy_inference_requests_total", model="scaled", status="success") >= 1
    assert metric_value(text, "onnxpy_inference_queue_depth", model="cnn") == 0
    assert metric_value(text, "onnxpy_inference_inflight", model="cnn") == 0
    count = metric_value(text, "onnxpy_inference_request_duration_seconds_count", model="scaled")
    inf = metric_value(text, "onnxpy_inference_request_duration_seconds_bucket", model="scaled", le="+Inf")
    assert count == inf > 0
    for line in text.splitlines():  # every sample line is "name{labels} number"
        if line and not line.startswith("#"):
            assert re.fullmatch(r'[a-z_]+(\{[^}]*\})? -?[0-9.e+-]+', line), line


# ------------------------------------------------------------------------------------------------ CLI process
def _start_cli(args, tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "onnxpy.serve", *args, "--port", "0", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    lines = []
    t_end = time.monotonic() + 60
    while time.monotonic() < t_end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            url = m.group(1)
            while time.monotonic() < t_end:  # wait for the lifespan startup
                try:
                    with urllib.request.urlopen(url + "/v2/health/ready", timeout=5) as r:
                        if r.status == 200:
                            return proc, url
                except OSError:
                    time.sleep(0.05)
    proc.kill()
    raise AssertionError("server did not start:\n" + "".join(lines) + (proc.stdout.read() or ""))


def _post(url, req, timeout=60):
    r = urllib.request.Request(url, data=json.dumps(req).encode(), method="POST")
    with urllib.request.urlopen(r, timeout=timeout) as resp:
        return resp.status, json.loads(resp.read())


def test_cli_model_repository_and_graceful_shutdown(tmp_path):
    repo = tmp_path / "models"
    for version, scale in ((1, 1.0), (3, 3.0)):
        (repo / "scaled" / str(version)).mkdir(parents=True)
        onnx.save(scaled_model(scale), str(repo / "scaled" / str(version) / "model.onnx"))
    (repo / "slow" / "1").mkdir(parents=True)
    onnx.save(slow_model(n=20), str(repo / "slow" / "1" / "model.onnx"))
    cnn_path = tmp_path / "cnn.onnx"
    onnx.save(default_model(), str(cnn_path))
    proc, url = _start_cli(["--model-repository", str(repo), str(cnn_path), "--max-batch-size", "4",
                            "--workers", "2"], tmp_path)
    try:
        x = {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}
        assert _post(url + "/v2/models/scaled/versions/1/infer", x)[1]["outputs"][0]["data"] == [1, 2]
        assert _post(url + "/v2/models/scaled/infer", x)[1]["outputs"][0]["data"] == [3, 6]
        with urllib.request.urlopen(url + "/v2/models/cnn") as r:
            assert json.loads(r.read())["inputs"][0]["shape"] == [-1, 3, 32, 32]
        with urllib.request.urlopen(url + "/v2/models/cnn/config") as r:
            assert json.loads(r.read())["max_batch_size"] == 4
        # graceful shutdown: a slow request in flight when SIGTERM arrives still completes
        result = {}

        def slow():
            try:
                result["resp"] = _post(url + "/v2/models/slow/infer",
                                       {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32",
                                                    "data": [0.1]}]})
            except Exception as e:  # noqa: BLE001
                result["error"] = e

        t = threading.Thread(target=slow)
        t.start()
        t_end = time.monotonic() + 30
        while time.monotonic() < t_end:  # wait until it is computing
            with urllib.request.urlopen(url + "/metrics") as r:
                if metric_value(r.read().decode(), "onnxpy_inference_inflight", model="slow") >= 1:
                    break
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        t.join(60)
        assert "error" not in result, result.get("error")
        assert result["resp"][0] == 200 and result["resp"][1]["model_name"] == "slow"
        assert proc.wait(60) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_usage_errors(tmp_path):
    from onnxpy.serve import cli_main

    assert cli_main([]) == 2
    assert cli_main([str(tmp_path / "missing.onnx")]) == 1
    (tmp_path / "repo" / "m" / "1").mkdir(parents=True)
    assert cli_main(["--model-repository", str(tmp_path / "repo")]) == 1
