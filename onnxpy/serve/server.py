"""Running the app: ``onnxpy serve`` (uvicorn, graceful shutdown on SIGTERM/SIGINT) and an in-process thread."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading

from .repository import ModelRepository


def _bind(host: str, port: int) -> socket.socket:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6:
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind(addr)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _uvicorn_server(app, log_level: str, graceful_timeout: float):
    try:
        import uvicorn
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("onnxpy serve needs the 'serve' extra: pip install 'onnxpy[serve]'") from e
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=graceful_timeout,
                            access_log=log_level in ("debug", "trace"))
    return uvicorn.Server(config)


class ServerThread:
    """Serve a repository from a background thread (tests, notebooks, embedding)::

        with ServerThread(ModelRepository.from_specs(["model.onnx"])) as srv:
            requests.post(srv.url + "/v2/models/model/infer", json=...)
    """

    def __init__(self, repository: ModelRepository, config=None, host: str = "127.0.0.1", port: int = 0,
                 log_level: str = "warning"):
        from .app import build_app

        self.app = build_app(repository, config)
        self.host = host
        self._sock = _bind(host, port)
        self.port = self._sock.getsockname()[1]
        self._server = _uvicorn_server(self.app, log_level, 30.0)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]},
                                        name="onnxpy-serve", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def server(self):
        return self.app.state.server

    def start(self, timeout: float = 30.0) -> ServerThread:
        import time

        self._thread.start()
        t_end = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > t_end:
                raise RuntimeError("the server thread did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0):
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def _size(text: str) -> int:
    t = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 1048576, 512K, 64M)") from None


def build_parser(prog: str = "onnxpy serve") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description="Serve ONNX models over HTTP with the KServe v2 / Triton open inference protocol.")
    p.add_argument("models", nargs="*", metavar="MODEL",
                   help="model files, as PATH (name = file stem) or NAME=PATH; served as version 1")
    p.add_argument("--model-repository", metavar="DIR",
                   help="Triton layout: DIR/<name>/<version>/model.onnx (every numeric version is served)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0 picks a free one)")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                   help="inference threads (default: CPU count)")
    p.add_argument("--max-batch-size", type=int, default=0,
                   help="dynamic batching: merge concurrent requests up to this many rows (models whose inputs and "
                        "outputs all have a dynamic first dim); 0 = off")
    p.add_argument("--max-queue-delay-ms", type=float, default=2.0,
                   help="dynamic batching: how long the first request waits for others (default 2 ms)")
    p.add_argument("--max-request-size", type=_size, default=64 << 20, metavar="BYTES",
                   help="request body limit, e.g. 64M (default); larger requests get 413")
    p.add_argument("--request-timeout", type=float, default=60.0, metavar="SECONDS",
                   help="per-request limit on queueing + compute, 504 when exceeded (default 60; 0 = none)")
    p.add_argument("--max-queue-size", type=int, default=0,
                   help="per model: 503 when this many requests are already waiting (default 0 = unbounded)")
    p.add_argument("--graceful-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, how long in-flight requests may take to finish (default 30)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    return p


def cli_main(argv=None) -> int:
    """``onnxpy serve ...``; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        import uvicorn  # noqa: F401

        from .app import ServeConfig, build_app
    except ImportError as e:
        print(f"error: onnxpy serve needs the 'serve' extra (pip install 'onnxpy[serve]'): {e}", file=sys.stderr)
        return 1
    if not args.models and not args.model_repository:
        print("error: give model files or --model-repository DIR", file=sys.stderr)
        return 2
    if args.workers < 1 or args.max_batch_size < 0 or args.max_queue_delay_ms < 0 or args.request_timeout < 0:
        print("error: --workers must be >= 1 and the batching/timeout values >= 0", file=sys.stderr)
        return 2
    try:
        repo = ModelRepository.from_specs(args.models, args.model_repository, max_batch_size=args.max_batch_size,
                                          max_queue_delay_ms=args.max_queue_delay_ms)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    cfg = ServeConfig(workers=args.workers, max_request_bytes=args.max_request_size,
                      request_timeout_s=args.request_timeout, max_queue_size=args.max_queue_size)
    app = build_app(repo, cfg)
    try:
        sock = _bind(args.host, args.port)
    except OSError as e:
        print(f"error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    for m in repo.all():
        batching = f", dynamic batching up to {m.max_batch_size}" if m.max_batch_size else ""
        if args.max_batch_size and not m.max_batch_size:
            batching = ", no dynamic batching (first dim is not dynamic everywhere)"
        print(f"onnxpy serve: model '{m.name}' version {m.version} ({m.path}){batching}", flush=True)
    host = f"[{args.host}]" if ":" in args.host else args.host
    print(f"onnxpy serve: listening on http://{host}:{port}", flush=True)
    server = _uvicorn_server(app, args.log_level, args.graceful_timeout)
    # uvicorn handles SIGTERM/SIGINT (stop accepting, let in-flight requests finish, run the lifespan shutdown)
    # and then re-raises the signal to the handler it found; with these no-op handlers the command exits 0.
    received = []
    old = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, lambda signum, frame: received.append(signum))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        for sig, h in old.items():
            signal.signal(sig, h)
    why = f" ({signal.Signals(received[0]).name})" if received else ""
    print(f"onnxpy serve: stopped{why}", flush=True)
    return 0
