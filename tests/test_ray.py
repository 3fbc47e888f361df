"""onnxpy.integrations.ray: OnnxPredictor (with and without Ray Data) and the Ray Serve deployment."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import onnxpy
from onnxpy.integrations.ray import OnnxPredictor
from onnxpy.models import default_model

try:
    import ray
except ImportError:  # visible in the pytest summary with -rs
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install 'ray[data,serve]')")


def _images(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 3, 32, 32)).astype(np.float32)


@pytest.fixture(scope="module")
def cnn_path(tmp_path_factory):
    p = tmp_path_factory.mktemp("ray") / "cnn.onnx"
    onnx.save(default_model(), str(p))
    return str(p)


@pytest.fixture(scope="module")
def reference():
    return onnxpy.InferenceSession(default_model().SerializeToString())


def string_model():
    g = helper.make_graph([helper.make_node("StringNormalizer", ["text"], ["upper"], case_change_action="UPPER")],
                          "s", [helper.make_tensor_value_info("text", TensorProto.STRING, ["N"])],
                          [helper.make_tensor_value_info("upper", TensorProto.STRING, ["N"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


# ------------------------------------------------------------------------------------------------ without Ray
def test_predictor_plain(cnn_path, reference):
    x = _images(5).astype(np.float64)  # cast to the model's float32
    pred = OnnxPredictor(cnn_path, input_map={"image": "pixels"}, outputs={"probabilities": "probs"},
                         keep_columns=["id"])
    out = pred({"pixels": x, "id": np.arange(5)})
    assert set(out) == {"id", "probs"}
    np.testing.assert_allclose(out["probs"], reference.run(None, {"image": x.astype(np.float32)})[0], rtol=1e-6)
    # a ragged-typed (object) column of equal-shaped tensors is stacked
    obj = np.empty(2, dtype=object)
    obj[0], obj[1] = x[0].astype(np.float32), x[1].astype(np.float32)
    out2 = OnnxPredictor(default_model())({"image": obj})
    np.testing.assert_allclose(out2["probabilities"], out["probs"][:2], rtol=1e-6)
    s = OnnxPredictor(string_model().SerializeToString())({"text": np.array(["ab", "Cd"])})
    assert list(s["upper"]) == ["AB", "CD"]
    with pytest.raises(ValueError, match="not model inputs"):
        OnnxPredictor(cnn_path, input_map={"img": "pixels"})
    with pytest.raises(KeyError, match="needs column 'pixels'"):
        pred({"image": x})


# ------------------------------------------------------------------------------------------------ Ray
@pytest.fixture(scope="module")
def ray_cluster():
    if ray is None:
        pytest.skip("Ray is not installed (pip install 'ray[data,serve]')")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    try:
        from ray import serve

        serve.shutdown()
    except Exception:  # noqa: BLE001 - best effort
        pass
    ray.shutdown()


@needs_ray
def test_ray_data_map_batches(ray_cluster, cnn_path, reference):
    n = 40
    x = _images(n, seed=1)
    ds = ray.data.from_items([{"id": i, "pixels": x[i]} for i in range(n)])
    preds = ds.map_batches(OnnxPredictor, fn_constructor_kwargs={
        "model": cnn_path, "input_map": {"image": "pixels"}, "keep_columns": ["id"]},
        batch_size=8, concurrency=2, batch_format="numpy")
    rows = preds.take_all()
    assert len(rows) == n
    got = np.stack([r["probabilities"] for r in sorted(rows, key=lambda r: r["id"])])
    np.testing.assert_allclose(got, reference.run(None, {"image": x})[0], rtol=1e-5, atol=1e-6)


@needs_ray
def test_ray_data_model_bytes(ray_cluster, reference):
    """Model passed as bytes: nothing has to exist on the workers' disks (the multi-node recipe)."""
    x = _images(12, seed=2)
    ds = ray.data.from_numpy(x)  # column "data"
    out = ds.map_batches(OnnxPredictor, fn_constructor_kwargs={
        "model": default_model().SerializeToString(), "input_map": {"image": "data"}},
        batch_size=6, concurrency=1, batch_format="numpy").take_all()
    got = np.stack([r["probabilities"] for r in out])
    ref = reference.run(None, {"image": x})[0]
    # row order may differ between blocks: compare as sets of rows
    np.testing.assert_allclose(np.sort(got, axis=0), np.sort(ref, axis=0), rtol=1e-5, atol=1e-6)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@needs_ray
def test_ray_serve_deployment(ray_cluster, reference):
    import concurrent.futures

    from ray import serve

    from onnxpy.integrations.ray import serve_deployment

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    app = serve_deployment(default_model(), name="cnn", max_batch_size=4, batch_wait_timeout_s=0.05,
                           ray_actor_options={"num_cpus": 0.5})
    handle = serve.run(app, name="cnn", route_prefix="/v2/models/cnn")
    x = _images(3, seed=3)
    out = handle.predict.remote({"image": x}).result(timeout_s=60)
    np.testing.assert_allclose(out["probabilities"], reference.run(None, {"image": x})[0], rtol=1e-5, atol=1e-6)
    # concurrent handle calls are batched on the replica and split back
    singles = [_images(1, seed=10 + i) for i in range(6)]
    resps = [handle.predict.remote({"image": s}) for s in singles]
    for s, r in zip(singles, resps):
        np.testing.assert_allclose(r.result(timeout_s=60)["probabilities"], reference.run(None, {"image": s})[0],
                                   rtol=1e-5, atol=1e-6)
    # v2 protocol over Ray Serve's HTTP proxy: plain JSON and tritonclient (binary)
    base = f"http://127.0.0.1:{port}/v2/models/cnn"
    with urllib.request.urlopen(base, timeout=30) as r:
        assert json.loads(r.read())["inputs"][0]["shape"] == [-1, 3, 32, 32]
    req = {"inputs": [{"name": "image", "shape": [1, 3, 32, 32], "datatype": "FP32",
                       "data": singles[0].reshape(-1).tolist()}]}
    r = urllib.request.Request(base + "/infer", data=json.dumps(req).encode(), method="POST")
    with urllib.request.urlopen(r, timeout=60) as resp:
        o = json.loads(resp.read())["outputs"][0]
    np.testing.assert_allclose(np.array(o["data"], np.float32).reshape(o["shape"]),
                               reference.run(None, {"image": singles[0]})[0], rtol=1e-5, atol=1e-6)
    bad = urllib.request.Request(base + "/infer", data=b"{oops", method="POST")
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.urlopen(bad, timeout=30)
    assert ei.value.code == 400 and "malformed JSON" in json.loads(ei.value.read())["error"]

    tc = pytest.importorskip("tritonclient.http")
    client = tc.InferenceServerClient(url=f"127.0.0.1:{port}")

    def infer(s):
        inp = tc.InferInput("image", list(s.shape), "FP32")
        inp.set_data_from_numpy(s)
        return client.infer("cnn", [inp]).as_numpy("probabilities")

    with concurrent.futures.ThreadPoolExecutor(1) as ex:  # one tritonclient connection is not thread-safe
        for s, got in zip(singles, ex.map(infer, singles)):
            np.testing.assert_allclose(got, reference.run(None, {"image": s})[0], rtol=1e-5, atol=1e-6)
    client.close()
    serve.delete("cnn")
