"""Running inference off the event loop: a thread pool, plus optional per-model dynamic batching."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import time

from .metrics import Metrics
from .protocol import ProtocolError
from .repository import ServedModel, concat_feeds, feeds_signature


class Executor:
    """Submits session runs to a worker thread pool and keeps the queue/inflight/compute metrics."""

    def __init__(self, workers: int, metrics: Metrics):
        self.workers = max(1, int(workers))
        self.pool = concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="onnxpy-infer")
        self.metrics = metrics

    def _work(self, model: ServedModel, output_names, feeds, n_requests: int):
        m = self.metrics
        m.queue(model.name, -n_requests)
        m.inflight(model.name, n_requests)
        t0 = time.perf_counter()
        try:
            return model.run(output_names, feeds)
        finally:
            m.compute(model.name, model.version, time.perf_counter() - t0, n_requests)
            m.inflight(model.name, -n_requests)

    def submit(self, model: ServedModel, output_names, feeds, n_requests: int = 1, queued: bool = False):
        """Returns an asyncio future. ``queued``: the requests are already counted in the queue depth."""
        if not queued:
            self.metrics.queue(model.name, n_requests)
        cf = self.pool.submit(self._work, model, output_names, feeds, n_requests)

        def on_done(f):  # cancelled before a worker picked it up: it left the queue without running
            if f.cancelled():
                self.metrics.queue(model.name, -n_requests)

        cf.add_done_callback(on_done)
        return asyncio.wrap_future(cf)

    def shutdown(self):
        self.pool.shutdown(wait=True)


class _Item:
    __slots__ = ("feeds", "n", "sig", "fut", "t")

    def __init__(self, feeds, n, fut, t):
        self.feeds, self.n, self.fut, self.t = feeds, n, fut, t
        self.sig = feeds_signature(feeds)


class DynamicBatcher:
    """Collects requests of one model for up to ``max_queue_delay_s`` (or until ``max_batch_size`` rows), runs
    them as one session call on the concatenated inputs and splits every output back along the first dim.

    At most ``executor.workers`` batches are in flight per model; while all are busy, new requests accumulate
    into the next (larger) batch.  Only requests with equal non-batch shapes and dtypes are merged.
    """

    def __init__(self, model: ServedModel, executor: Executor):
        self.model = model
        self.executor = executor
        self.max_batch = model.max_batch_size
        self.delay = model.max_queue_delay_s
        self._pending: collections.deque[_Item] = collections.deque()
        self._wakeup = asyncio.Event()
        self._slots = asyncio.Semaphore(executor.workers)
        self._task: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()

    def start(self):
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.model.name}")

    async def stop(self):
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for it in self._pending:
            if not it.fut.done():
                it.fut.set_exception(ProtocolError("server is shutting down", status=503))
        self._pending.clear()

    async def submit(self, feeds: dict, n: int) -> list:
        """Run ``feeds`` (first dim ``n``) as part of a batch; returns all outputs in model order."""
        loop = asyncio.get_running_loop()
        if n >= self.max_batch or n == 0:
            return await self.executor.submit(self.model, None, feeds)
        fut = loop.create_future()
        self._pending.append(_Item(feeds, n, fut, loop.time()))
        self.executor.metrics.queue(self.model.name, 1)
        self._wakeup.set()
        return await fut

    def _drop_done(self):
        while self._pending and self._pending[0].fut.done():  # timed out / cancelled while waiting
            self._pending.popleft()
            self.executor.metrics.queue(self.model.name, -1)

    async def _loop(self):
        loop = asyncio.get_running_loop()
        while True:
            self._drop_done()
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            first = self._pending[0]
            deadline = first.t + self.delay
            while True:
                rows = sum(it.n for it in self._pending if it.sig == first.sig and not it.fut.done())
                left = deadline - loop.time()
                if rows >= self.max_batch or left <= 0:
                    break
                self._wakeup.clear()
                try:
                    await asyncio.wait_for(self._wakeup.wait(), left)
                except TimeoutError:
                    break
            await self._slots.acquire()  # more requests may arrive while every worker is busy
            self._drop_done()
            if not self._pending:
                self._slots.release()
                continue
            first = self._pending[0]
            take, keep, rows = [], collections.deque(), 0
            for it in self._pending:
                if it.fut.done():
                    self.executor.metrics.queue(self.model.name, -1)
                elif it.sig == first.sig and rows + it.n <= self.max_batch:
                    take.append(it)
                    rows += it.n
                else:
                    keep.append(it)
            self._pending = keep
            task = loop.create_task(self._dispatch(take, rows))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _dispatch(self, items: list[_Item], rows: int):
        try:
            feeds = items[0].feeds if len(items) == 1 else concat_feeds([it.feeds for it in items])
            try:
                outs = await self.executor.submit(self.model, None, feeds, len(items), queued=True)
            except Exception as e:  # noqa: BLE001 - delivered to each request
                for it in items:
                    if not it.fut.done():
                        it.fut.set_exception(e)
                return
            if len(items) == 1:
                results = [outs]
            elif all(hasattr(o, "shape") and o.ndim >= 1 and o.shape[0] == rows for o in outs):
                results, off = [], 0
                for it in items:
                    results.append([o[off:off + it.n] for o in outs])
                    off += it.n
            else:  # outputs do not follow the batch dim: run the requests one by one instead
                results = []
                for it in items:
                    try:
                        results.append(await self.executor.submit(self.model, None, it.feeds))
                    except Exception as e:  # noqa: BLE001
                        results.append(e)
            for it, r in zip(items, results):
                if it.fut.done():
                    continue
                if isinstance(r, Exception):
                    it.fut.set_exception(r)
                else:
                    it.fut.set_result(r)
        finally:
            self._slots.release()
