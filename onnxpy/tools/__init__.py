"""Command-line tools and helpers built on onnxpy (benchmarking, profiling reports, model conversion)."""
