"""Integrations of onnxpy with other frameworks (imported lazily; each needs its framework installed)."""
