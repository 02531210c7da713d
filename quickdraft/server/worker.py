"""The engine worker: one thread runs the engine, one request at a time, from a bounded FIFO queue.

The engine is not thread-safe and decodes at batch size 1, so every generation runs on this
thread. The HTTP side submits a `Job` (prompt ids, sampling parameters, speculation config) and
reads its events (`TextDelta`s, then `Finished`, or `Cancelled` / `Failed`) from an asyncio
queue that the worker fills with `call_soon_threadsafe`. Requests are served in arrival order;
when `max_waiting` requests already wait, `submit` refuses the next one at once.

Cancelling a job (its client went away, or the server stops) removes it from the queue, or, if it
is running, closes its generator at the next engine event: each event comes from one engine step.
"""

import asyncio
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine, Finished, TextDelta
from quickdraft.server.metrics import RequestTiming, ServerMetrics

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cancelled:
    """The job stopped before finishing: its client went away or the server is stopping."""


@dataclass(frozen=True)
class Failed:
    """The engine raised while running the job."""

    error: Exception


JobEvent = TextDelta | Finished | Cancelled | Failed


class QueueFull(Exception):
    """The worker already has as many waiting jobs as it accepts."""


class Job:
    """One generation request, created on the event loop and run on the worker thread."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, spec: SpecConfig) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.spec = spec
        self.queued = time.perf_counter()
        self._loop = asyncio.get_running_loop()
        self._events: asyncio.Queue[JobEvent] = asyncio.Queue()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()

    def emit(self, event: JobEvent) -> None:
        """Hand an event to the event loop (callable from any thread)."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass

    async def next_event(self) -> JobEvent:
        return await self._events.get()


class EngineWorker:
    """Owns the engine thread and the queue of jobs waiting for it."""

    def __init__(self, engine: Engine, metrics: ServerMetrics, max_waiting: int) -> None:
        self.engine = engine
        self.metrics = metrics
        self.max_waiting = max_waiting
        self._condition = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name="quickdraft-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue a job, or raise `QueueFull` when `max_waiting` jobs already wait behind a running one."""
        with self._condition:
            busy = len(self._waiting) + (self._running is not None)
            if self._stopping or busy > self.max_waiting:
                raise QueueFull
            self._waiting.append(job)
            self._condition.notify()

    def cancel(self, job: Job) -> None:
        """Stop a job wherever it is; a no-op for a job that already finished."""
        job.cancel()
        with self._condition:
            if job in self._waiting:
                self._waiting.remove(job)
                self.metrics.count_aborted()

    def load(self) -> tuple[int, int]:
        """(running, waiting) jobs right now."""
        with self._condition:
            return int(self._running is not None), len(self._waiting)

    def stop(self, timeout: float) -> None:
        """Cancel every job, let the running one stop at its next step, and end the thread."""
        with self._condition:
            self._stopping = True
            for job in self._waiting:
                job.cancel()
                self.metrics.count_aborted()
                job.emit(Cancelled())
            self._waiting.clear()
            if self._running is not None:
                self._running.cancel()
            self._condition.notify_all()
        self._thread.join(timeout)

    def _serve(self) -> None:
        while (job := self._next_job()) is not None:
            self._run(job)
            with self._condition:
                self._running = None

    def _next_job(self) -> Job | None:
        with self._condition:
            while not self._waiting and not self._stopping:
                self._condition.wait()
            if self._stopping:
                return None
            self._running = self._waiting.popleft()
            return self._running

    def _run(self, job: Job) -> None:
        self.metrics.count_started(len(job.prompt_ids))
        first_token = None
        try:
            events = self.engine.stream(job.prompt_ids, job.params, spec=job.spec)
            for event in events:
                if job.cancelled:
                    events.close()
                    self.metrics.count_aborted()
                    job.emit(Cancelled())
                    return
                first_token = first_token or time.perf_counter()
                if isinstance(event, Finished):
                    self.metrics.count_finished(
                        event.finish_reason, event.stats, RequestTiming(job.queued, first_token, time.perf_counter())
                    )
                job.emit(event)
        except Exception as exc:  # reported to the client as a 500; the worker keeps serving
            logger.exception("generation failed")
            self.metrics.count_failed()
            job.emit(Failed(exc))
