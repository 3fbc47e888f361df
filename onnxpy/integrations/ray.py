"""Ray integration: batch inference with Ray Data and online serving with Ray Serve.

Ray Data (one session per worker; the class is instantiated once per actor)::

    import ray
    from onnxpy.integrations.ray import OnnxPredictor

    ds = ray.data.read_parquet("s3://bucket/images/")
    preds = ds.map_batches(OnnxPredictor, fn_constructor_kwargs={"model": "model.onnx",
                           "input_map": {"image": "pixels"}, "keep_columns": ["id"]},
                           batch_size=64, concurrency=4, batch_format="numpy")

Ray Serve (KServe v2 JSON/binary protocol over HTTP, plus ``handle.predict.remote({name: array})``)::

    from ray import serve
    from onnxpy.integrations.ray import serve_deployment

    app = serve_deployment("model.onnx", name="cnn", num_replicas=2, max_batch_size=8)
    handle = serve.run(app, name="cnn", route_prefix="/v2/models/cnn")

Ray itself is imported only when a Ray-specific function is called; :class:`OnnxPredictor` works without Ray.
"""

from __future__ import annotations

import asyncio
import os

import numpy as np

from ..serve.protocol import ProtocolError


def _model_source(model):
    """Path, bytes or ModelProto -> what InferenceSession takes (ModelProto is serialized)."""
    if hasattr(model, "SerializeToString"):
        return model.SerializeToString()
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    raise TypeError(f"model must be a path, bytes or onnx.ModelProto, got {type(model).__name__}")


def _onnx_dtype(type_str: str):
    from ..serve.protocol import numpy_dtype, onnx_type_to_v2

    return numpy_dtype(onnx_type_to_v2(type_str))


def _column_to_input(col, dtype: np.dtype, name: str) -> np.ndarray:
    """A batch column (ndarray, list, object array of equal-shaped arrays) -> model input array of ``dtype``."""
    arr = col if isinstance(col, np.ndarray) else np.asarray(col)
    if arr.dtype == object and arr.size and isinstance(arr.reshape(-1)[0], np.ndarray):  # ragged tensor column
        try:
            arr = np.stack(list(arr))
        except ValueError:
            raise ValueError(f"column for input '{name}' holds tensors of different shapes; "
                             f"resize/pad them before inference") from None
    if dtype.kind == "O":  # ONNX string tensor
        if arr.dtype.kind in "OUS":
            out = np.empty(arr.shape, dtype=object)
            out.reshape(-1)[:] = [x.decode("utf-8") if isinstance(x, bytes) else str(x) for x in arr.reshape(-1)]
            return out
        raise TypeError(f"input '{name}' is a string tensor, the column has dtype {arr.dtype}")
    if arr.dtype != dtype:
        if arr.dtype.kind in "OUS":
            raise TypeError(f"input '{name}' expects {dtype}, the column has dtype {arr.dtype}")
        arr = arr.astype(dtype)
    return arr


class OnnxPredictor:
    """Callable for ``Dataset.map_batches``: dict of numpy columns in, dict of numpy columns out.

    model:        path to an .onnx file (must exist on every node), bytes or ``onnx.ModelProto``
                  (bytes travel to the workers with the task, so nothing needs to be on the nodes' disks).
    input_map:    ``{model input name: column name}``; default: columns named like the inputs.
    outputs:      output names to compute (default all), or ``{output name: column name}`` to rename.
    keep_columns: batch columns copied to the result unchanged (e.g. ids), or ``True`` for all of them.
    sess_options, providers: passed to ``onnxpy.InferenceSession``.

    Columns are cast to the model's input dtype (e.g. float64 -> float32); string columns feed string inputs.
    One session is created per instance, i.e. once per Ray actor when used with ``concurrency=N``.
    """

    def __init__(self, model, input_map: dict | None = None, outputs=None, keep_columns=None,
                 sess_options=None, providers=None):
        from .. import InferenceSession

        self.session = InferenceSession(_model_source(model), sess_options=sess_options, providers=providers)
        self.inputs = {a.name: _onnx_dtype(a.type) for a in self.session.get_inputs()}
        all_outputs = [o.name for o in self.session.get_outputs()]
        self.input_map = dict(input_map) if input_map else {n: n for n in self.inputs}
        unknown = set(self.input_map) - set(self.inputs)
        if unknown:
            raise ValueError(f"input_map names {sorted(unknown)} are not model inputs {sorted(self.inputs)}")
        if outputs is None:
            self.output_map = {n: n for n in all_outputs}
        elif isinstance(outputs, dict):
            self.output_map = dict(outputs)
        else:
            self.output_map = {n: n for n in outputs}
        unknown = set(self.output_map) - set(all_outputs)
        if unknown:
            raise ValueError(f"outputs {sorted(unknown)} are not model outputs {all_outputs}")
        self.keep_columns = keep_columns

    def __call__(self, batch: dict) -> dict:
        feeds = {}
        for name, dtype in self.inputs.items():
            col = self.input_map.get(name)
            if col is None or col not in batch:
                raise KeyError(f"model input '{name}' needs column '{col or name}'; batch columns: {sorted(batch)}")
            feeds[name] = _column_to_input(batch[col], dtype, name)
        names = list(self.output_map)
        outs = self.session.run(names, feeds)
        result = {}
        if self.keep_columns is True:
            result.update(batch)
        elif self.keep_columns:
            for c in self.keep_columns:
                result[c] = batch[c]
        for n, v in zip(names, outs):
            result[self.output_map[n]] = v
        return result


# ------------------------------------------------------------------------------------------------ Ray Serve
class _ServeModel:
    """Deployment body (plain class; wrapped by ``serve.deployment`` in :func:`serve_deployment`)."""

    def __init__(self, model, name: str):
        from ..serve.repository import ServedModel

        self.model = ServedModel.load(name, "1", _model_source(model))
        self.names = [t.name for t in self.model.outputs]

    def _run(self, feeds: dict) -> dict:
        return dict(zip(self.names, self.model.run(None, feeds)))

    async def _predict_one(self, inputs: dict) -> dict:
        return await asyncio.get_running_loop().run_in_executor(None, self._run, inputs)

    async def _predict_many(self, batch: list[dict]) -> list[dict]:
        """Concatenate requests along the first dim when shapes allow, else run them one by one."""
        from ..serve.repository import concat_feeds, feeds_signature

        loop = asyncio.get_running_loop()
        if len(batch) > 1 and self.model.batchable and len({feeds_signature(b) for b in batch}) == 1:
            rows = [next(iter(b.values())).shape[0] for b in batch]
            outs = await loop.run_in_executor(None, self._run, concat_feeds(batch))
            if all(v.ndim >= 1 and v.shape[0] == sum(rows) for v in outs.values()):
                res, off = [], 0
                for n in rows:
                    res.append({k: v[off:off + n] for k, v in outs.items()})
                    off += n
                return res
        return [await loop.run_in_executor(None, self._run, b) for b in batch]

    def _as_feeds(self, inputs: dict) -> dict:
        if not isinstance(inputs, dict):
            raise TypeError("predict() takes a dict {input name: array}")
        feeds = {}
        for t in self.model.inputs:
            if t.name not in inputs:
                raise KeyError(f"missing input '{t.name}'")
            feeds[t.name] = _column_to_input(inputs[t.name], _onnx_dtype(t.onnx_type), t.name)
        return feeds

    async def handle_http(self, request, predict):
        """KServe v2 over Ray Serve's HTTP proxy: GET -> metadata (``.../ready`` -> readiness), POST -> infer."""
        from starlette.responses import JSONResponse, Response

        from ..serve.protocol import HEADER_LENGTH, build_infer_response, parse_infer_request

        path = request.url.path.rstrip("/")
        try:
            if request.method == "GET":
                if path.endswith("/ready"):
                    return JSONResponse({"name": self.model.name, "ready": True})
                return JSONResponse(self.model.metadata(["1"]))
            if request.method != "POST" or not path.endswith("/infer"):
                return JSONResponse({"error": f"unsupported: {request.method} {path}"}, status_code=404)
            body = await request.body()
            hl = request.headers.get(HEADER_LENGTH)
            try:
                hl = int(hl) if hl is not None else None
            except ValueError:
                raise ProtocolError(f"invalid {HEADER_LENGTH} header") from None
            req, feeds, types = parse_infer_request(body, hl)
            feeds, _ = self.model.validate(feeds, types)
            params = req.get("parameters") or {}
            wanted = self.model.output_names(req.get("outputs"), bool(params.get("binary_data_output", False)))
            try:
                outs = await predict(feeds)
            except Exception as e:  # noqa: BLE001 - reported to the client
                raise ProtocolError(f"inference failed: {e}") from e
            head = {"model_name": self.model.name, "model_version": "1"}
            if "id" in req:
                head["id"] = req["id"]
            payload, json_len = build_infer_response(head, [(n, outs[n], b) for n, b in wanted])
            if json_len is None:
                return Response(payload, media_type="application/json")
            return Response(payload, media_type="application/octet-stream", headers={HEADER_LENGTH: str(json_len)})
        except ProtocolError as e:
            return JSONResponse({"error": str(e)}, status_code=e.status)


def serve_deployment(model, *, name: str = "onnx", num_replicas: int = 1, max_batch_size: int = 0,
                     batch_wait_timeout_s: float = 0.005, ray_actor_options: dict | None = None,
                     max_ongoing_requests: int = 32):
    """A bound Ray Serve application serving ``model`` (path, bytes or ModelProto).

    Each replica holds one session.  HTTP requests (routed by ``serve.run(app, route_prefix=...)``; use
    ``route_prefix=f"/v2/models/{name}"`` so Triton/KServe clients find it) speak the v2 inference protocol;
    ``DeploymentHandle.predict.remote({input: array})`` returns ``{output: array}``.  With ``max_batch_size > 1``
    concurrent calls on a replica are merged along the first (batch) dim via ``serve.batch``.

    Pass the model as bytes (or a ModelProto) to run on a multi-node cluster without copying files to the nodes.
    """
    from ray import serve

    src = _model_source(model)
    actor_opts = {"num_cpus": 1} if ray_actor_options is None else dict(ray_actor_options)

    if max_batch_size and max_batch_size > 1:
        class OnnxDeployment(_ServeModel):
            @serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_timeout_s)
            async def _batched(self, batch: list[dict]) -> list[dict]:
                return await self._predict_many(batch)

            async def predict(self, inputs: dict) -> dict:
                return await self._batched(self._as_feeds(inputs))

            async def __call__(self, request):
                return await self.handle_http(request, self._batched)
    else:
        class OnnxDeployment(_ServeModel):
            async def predict(self, inputs: dict) -> dict:
                return await self._predict_one(self._as_feeds(inputs))

            async def __call__(self, request):
                return await self.handle_http(request, self._predict_one)

    dep = serve.deployment(OnnxDeployment, name=name, num_replicas=num_replicas, ray_actor_options=actor_opts,
                           max_ongoing_requests=max_ongoing_requests)
    return dep.bind(src, name)


__all__ = ["OnnxPredictor", "serve_deployment"]
