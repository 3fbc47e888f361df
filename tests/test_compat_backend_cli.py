"""onnxruntime import compatibility, the onnx Backend API, and the CLI."""

import subprocess
import sys

import numpy as np
import onnx.backend.base
import pytest
from onnx import TensorProto, helper

import onnxpy
import onnxpy.backend as backend
from onnxpy import cli


def test_compat_maps_onnxruntime_modules(tmp_path):
    script = tmp_path / "app.py"
    script.write_text(
        "import onnxruntime as ort\n"
        "from onnxruntime.capi.onnxruntime_pybind11_state import InvalidArgument\n"
        "import onnxruntime.backend\n"
        "print(ort.__name__, InvalidArgument.__module__, onnxruntime.backend.__name__)\n"
    )
    out = subprocess.run([sys.executable, "-m", "onnxpy.compat", str(script)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["onnxpy", "onnxpy.capi.onnxruntime_pybind11_state", "onnxpy.backend"]


def test_backend_api(add_model_bytes):
    assert issubclass(backend.OnnxpyBackend, onnx.backend.base.Backend)
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    x = np.ones((2, 3), np.float32)
    rep = backend.prepare(onnx.load_from_string(add_model_bytes))
    np.testing.assert_array_equal(rep.run([x, x])[0], 2 * x)
    np.testing.assert_array_equal(backend.run_model(onnx.load_from_string(add_model_bytes), [x, x])[0], 2 * x)
    node = helper.make_node("Add", ["a", "b"], ["c"])
    np.testing.assert_array_equal(backend.run_node(node, [x, x])[0], 2 * x)


def test_cli_default_model(capsys):
    assert cli.main(["run", "--repeat", "2"]) == 0
    out = capsys.readouterr().out
    assert "probabilities: float32[1, 10]" in out and "latency" in out


def test_default_model_matches_onnxruntime():
    ortref = pytest.importorskip("onnxruntime")
    from onnxpy.models import default_input, default_model

    mb = default_model().SerializeToString()
    feed = default_input(2)
    ours = onnxpy.InferenceSession(mb).run(None, feed)[0]
    theirs = ortref.InferenceSession(mb, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(ours.sum(axis=1), 1, rtol=1e-5)


def test_cli_run_model_with_inputs(tmp_path, add_model_bytes, capsys):
    p = tmp_path / "add.onnx"
    p.write_bytes(add_model_bytes)
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    assert cli.main(["run", str(p), "--input", f"X={tmp_path / 'x.npy'}", "--repeat", "1",
                     "--output-dir", str(tmp_path / "out")]) == 0
    assert np.load(tmp_path / "out" / "Z.npy").shape == (2, 3)
    assert cli.main(["info", str(p)]) == 0
    out = capsys.readouterr().out
    assert "ai.onnx:Add x1" in out and "unsupported ops: none" in out and "parameters: 0 (0.00 MiB)" in out


def test_cli_help_exit_codes():
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    with pytest.raises(SystemExit) as e:
        cli.main(["nosuchcommand"])
    assert e.value.code == 2


def test_unsupported_type_input_rejected():
    g = helper.make_graph([helper.make_node("Identity", ["X"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.STRING, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.STRING, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    s = onnxpy.InferenceSession(m.SerializeToString())
    out = s.run(None, {"X": np.array(["a", "bc"])})[0]
    assert out.dtype == object and list(out) == ["a", "bc"]


def test_cli_run_npz_inputs(tmp_path, add_model_bytes, capsys):
    p = tmp_path / "add.onnx"
    p.write_bytes(add_model_bytes)
    np.savez(tmp_path / "feeds.npz", X=np.ones((2, 3), np.float32), Y=np.full((2, 3), 2, np.float32))
    assert cli.main(["run", str(p), "--input", str(tmp_path / "feeds.npz"), "--repeat", "1"]) == 0
    assert "[[3. 3. 3.]" in capsys.readouterr().out


def test_cli_optimize(tmp_path, capsys):
    import onnx

    from onnxpy.models import default_model

    src, dst = tmp_path / "m.onnx", tmp_path / "opt.onnx"
    onnx.save(default_model(), str(src))
    assert cli.main(["optimize", str(src), str(dst), "--level", "basic"]) == 0
    out = capsys.readouterr().out
    assert "ConvBNFusion: 1" in out and "10 -> 9 nodes" in out
    ops = [n.op_type for n in onnx.load(str(dst)).graph.node]
    assert "BatchNormalization" not in ops
    feed = {"image": np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)}
    np.testing.assert_allclose(onnxpy.InferenceSession(str(dst)).run(None, feed)[0],
                               onnxpy.InferenceSession(str(src)).run(None, feed)[0], rtol=1e-5, atol=1e-6)


def test_cli_info_names_unsupported_ops(tmp_path, capsys):
    import onnx

    g = helper.make_graph([helper.make_node("Foo", ["X"], ["Y"], domain="x.y")], "g",
                          [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1])])
    p = tmp_path / "foo.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("x.y", 1)]),
              str(p))
    assert cli.main(["info", str(p)]) == 1
    out = capsys.readouterr().out
    assert "unsupported ops: x.y:Foo(1)" in out and "cannot create a session" in out
