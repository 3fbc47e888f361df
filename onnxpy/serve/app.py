"""The Starlette application: KServe v2 / Triton HTTP endpoints, /metrics, error handling."""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from .. import __version__
from ..capi.onnxruntime_pybind11_state import EngineError, RuntimeException
from .batching import DynamicBatcher, Executor
from .metrics import Metrics
from .protocol import HEADER_LENGTH, ProtocolError, build_infer_response, parse_infer_request
from .repository import ModelRepository, ServedModel

EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics", "model_configuration"]
_INLINE_PARSE_BYTES = 64 * 1024  # bigger bodies are parsed/encoded in a thread, off the event loop


@dataclass
class ServeConfig:
    workers: int = 2                      # inference threads
    max_request_bytes: int = 64 << 20     # request body limit (after decompression too)
    request_timeout_s: float = 60.0       # per-request limit on queueing + compute
    max_queue_size: int = 0               # >0: 503 when this many requests of a model are waiting


class _Timeout(Exception):
    pass


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


class InferenceServer:
    """State shared by the handlers: repository, executor, batchers, metrics."""

    def __init__(self, repository: ModelRepository, config: ServeConfig | None = None):
        self.repo = repository
        self.config = config or ServeConfig()
        self.metrics = Metrics()
        self.executor: Executor | None = None
        self.batchers: dict[tuple[str, str], DynamicBatcher] = {}
        self.ready = False
        self.stats: dict[tuple[str, str], dict] = {}

    # -- lifecycle -----------------------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.executor = Executor(self.config.workers, self.metrics)
        for m in self.repo.all():
            if m.max_batch_size:
                b = DynamicBatcher(m, self.executor)
                b.start()
                self.batchers[(m.name, m.version)] = b
        self.ready = True
        try:
            yield
        finally:
            self.ready = False
            for b in self.batchers.values():
                await b.stop()
            await asyncio.get_running_loop().run_in_executor(None, self.executor.shutdown)

    # -- helpers -------------------------------------------------------------------------------------------
    def _model(self, request: Request) -> ServedModel:
        p = request.path_params
        return self.repo.get(p["name"], p.get("version"))

    async def _body(self, request: Request) -> bytes:
        limit = self.config.max_request_bytes
        cl = request.headers.get("content-length")
        if cl is not None:
            try:
                n = int(cl)
            except ValueError:
                raise ProtocolError("invalid Content-Length") from None
            if n > limit:
                raise ProtocolError(f"request body of {n} bytes exceeds the limit of {limit}", status=413)
        chunks, total = [], 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > limit:
                raise ProtocolError(f"request body exceeds the limit of {limit} bytes", status=413)
            chunks.append(chunk)
        body = b"".join(chunks)
        enc = request.headers.get("content-encoding", "").strip().lower()
        if enc in ("gzip", "deflate"):
            d = zlib.decompressobj(wbits=31 if enc == "gzip" else 15)
            try:
                body = d.decompress(body, limit + 1)
            except zlib.error as e:
                raise ProtocolError(f"cannot decompress the {enc} body: {e}") from None
            if len(body) > limit or d.unconsumed_tail:
                raise ProtocolError(f"decompressed request body exceeds the limit of {limit} bytes", status=413)
        elif enc not in ("", "identity"):
            raise ProtocolError(f"unsupported Content-Encoding '{enc}'", status=415)
        return body

    # -- endpoints -----------------------------------------------------------------------------------------
    async def server_metadata(self, request):
        return JSONResponse({"name": "onnxpy", "version": __version__, "extensions": EXTENSIONS})

    async def live(self, request):
        return JSONResponse({"live": True})

    async def ready_ep(self, request):
        return JSONResponse({"ready": self.ready}, status_code=200 if self.ready else 503)

    async def model_metadata(self, request):
        m = self._model(request)
        return JSONResponse(m.metadata(self.repo.versions(m.name)))

    async def model_ready(self, request):
        self._model(request)
        return JSONResponse({"name": request.path_params["name"], "ready": self.ready},
                            status_code=200 if self.ready else 503)

    async def model_config(self, request):
        return JSONResponse(self._model(request).config())

    async def model_stats(self, request):
        p = request.path_params
        if "name" in p:
            models = [self._model(request)] if p.get("version") else \
                [self.repo.get(p["name"], v) for v in self.repo.versions(p["name"])]
        else:
            models = self.repo.all()
        out = []
        for m in models:
            s = self.stats.get((m.name, m.version), {})
            out.append({"name": m.name, "version": m.version,
                        "inference_count": s.get("success", 0), "execution_count": s.get("success", 0),
                        "inference_stats": {"success": {"count": s.get("success", 0), "ns": s.get("ns", 0)},
                                            "fail": {"count": s.get("failure", 0), "ns": 0}}})
        return JSONResponse({"model_stats": out})

    async def repository_index(self, request):
        await self._body(request)
        return JSONResponse([{"name": m.name, "version": m.version, "state": "READY" if self.ready else "UNAVAILABLE",
                              "reason": ""} for m in self.repo.all()])

    async def metrics_ep(self, request):
        text = self.metrics.render([(m.name, m.version) for m in self.repo.all()])
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def infer(self, request: Request):
        t0 = time.perf_counter()
        model = self._model(request)  # unknown model -> 404 before the body is read
        ok = False
        try:
            resp = await self._infer(request, model)
            ok = True
            return resp
        finally:
            dt = time.perf_counter() - t0
            self.metrics.request(model.name, model.version, ok, dt)
            s = self.stats.setdefault((model.name, model.version), {})
            key = "success" if ok else "failure"
            s[key] = s.get(key, 0) + 1
            if ok:
                s["ns"] = s.get("ns", 0) + int(dt * 1e9)

    async def _infer(self, request: Request, model: ServedModel):
        if not self.ready:
            raise ProtocolError("server is not ready", status=503)
        body = await self._body(request)
        hl = request.headers.get(HEADER_LENGTH)
        if hl is not None:
            try:
                hl = int(hl)
            except ValueError:
                raise ProtocolError(f"invalid {HEADER_LENGTH} header '{hl}'") from None
        if len(body) > _INLINE_PARSE_BYTES:
            req, feeds, types = await run_in_threadpool(parse_infer_request, body, hl)
        else:
            req, feeds, types = parse_infer_request(body, hl)
        feeds, batch = model.validate(feeds, types)
        params = req.get("parameters") or {}
        wanted = model.output_names(req.get("outputs"), bool(params.get("binary_data_output", False)))
        timeout = self.config.request_timeout_s
        if "timeout" in params:  # Triton: microseconds
            t = params["timeout"]
            if not isinstance(t, (int, float)) or isinstance(t, bool) or t <= 0:
                raise ProtocolError("parameter 'timeout' must be a positive number of microseconds")
            timeout = min(timeout, t / 1e6) if timeout else t / 1e6
        if self.config.max_queue_size and self.metrics.queue_depth(model.name) >= self.config.max_queue_size:
            raise ProtocolError(f"model '{model.name}' queue is full", status=503)

        batcher = self.batchers.get((model.name, model.version))
        all_names = [t.name for t in model.outputs]
        try:
            if batcher is not None and batch is not None:
                coro = batcher.submit(feeds, batch)
            else:
                coro = self.executor.submit(model, [n for n, _ in wanted], feeds)
            outs = await asyncio.wait_for(coro, timeout) if timeout else await coro
        except TimeoutError:
            raise _Timeout(f"inference on model '{model.name}' did not finish within {timeout:g} s") from None
        except ProtocolError:
            raise
        except Exception as e:  # noqa: BLE001 - the session rejected the inputs (or failed): tell the client
            status = _session_error_status(e)
            raise ProtocolError(f"inference failed: {e}" if status < 500 else f"internal error: {e}", status) from e
        if batcher is not None and batch is not None:
            by_name = dict(zip(all_names, outs))
            outs = [by_name[n] for n, _ in wanted]
        head = {"model_name": model.name, "model_version": model.version}
        if "id" in req:
            head["id"] = req["id"]
        triples = [(n, v, b) for (n, b), v in zip(wanted, outs)]
        if sum(getattr(v, "nbytes", 0) for v in outs) > _INLINE_PARSE_BYTES:
            payload, json_len = await run_in_threadpool(build_infer_response, head, triples)
        else:
            payload, json_len = build_infer_response(head, triples)
        if json_len is None:
            return Response(payload, media_type="application/json")
        return Response(payload, media_type="application/octet-stream", headers={HEADER_LENGTH: str(json_len)})


def _session_error_status(e: Exception) -> int:
    if isinstance(e, (EngineError, RuntimeException, MemoryError)):
        return 500
    return 400  # invalid input values/shapes reaching the session, like Triton's INVALID_ARG


def build_app(repository: ModelRepository, config: ServeConfig | None = None) -> Starlette:
    """A Starlette ASGI app serving ``repository`` (run it with uvicorn or any ASGI server)."""
    srv = InferenceServer(repository, config)
    m = "/v2/models/{name}"
    mv = "/v2/models/{name}/versions/{version}"
    routes = [
        Route("/v2", srv.server_metadata, methods=["GET"]),
        Route("/v2/health/live", srv.live, methods=["GET"]),
        Route("/v2/health/ready", srv.ready_ep, methods=["GET"]),
        Route("/v2/repository/index", srv.repository_index, methods=["POST"]),
        Route("/v2/models/stats", srv.model_stats, methods=["GET"]),
        Route("/metrics", srv.metrics_ep, methods=["GET"]),
    ]
    for base in (m, mv):
        routes += [
            Route(base, srv.model_metadata, methods=["GET"]),
            Route(base + "/ready", srv.model_ready, methods=["GET"]),
            Route(base + "/config", srv.model_config, methods=["GET"]),
            Route(base + "/stats", srv.model_stats, methods=["GET"]),
            Route(base + "/infer", srv.infer, methods=["POST"]),
        ]

    async def protocol_error(request, exc: ProtocolError):
        srv.metrics.http_error(exc.status)
        return _error(str(exc), exc.status)

    async def http_error(request, exc: HTTPException):
        srv.metrics.http_error(exc.status_code)
        return _error(exc.detail or "error", exc.status_code)

    async def timeout_error(request, exc: _Timeout):
        srv.metrics.http_error(504)
        return _error(str(exc), 504)

    app = Starlette(routes=routes, lifespan=srv.lifespan, exception_handlers={
        ProtocolError: protocol_error, HTTPException: http_error, _Timeout: timeout_error,
    })
    app.state.server = srv
    return app


__all__ = ["ServeConfig", "InferenceServer", "build_app"]
