"""Test helpers shipped with onnxpy (the ONNX backend conformance runner)."""
