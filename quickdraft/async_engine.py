"""`AsyncEngine`: the engine on a thread of its own, for asyncio code with many concurrent streams.

    async_engine = AsyncEngine(Engine.from_names(max_batch=8), max_waiting=16)
    async_engine.start()
    async for event in async_engine.stream(prompt_ids, SamplingParams(max_new_tokens=64)):
        ...  # TextDelta events, then Finished (a failure raises, a cancellation raises EngineCancelled)
    async_engine.stop(timeout=10)

The engine is not thread-safe, so every generation runs on this thread. Callers submit a
`Job` (prompt ids, sampling parameters, speculation config) and read its events (`TextDelta`s,
then `Finished`, or `Cancelled` / `Failed`) from an asyncio queue that the thread fills through
`call_soon_threadsafe`. Each loop hands newly submitted jobs to the engine, drops cancelled ones,
runs one engine step (up to `max_batch` requests at once; the rest wait in arrival order) and
routes the step's events, all of them in one call per event loop: each call wakes the loop (a write to
its self-pipe) and takes the GIL from this thread, and a call per event stood out in py-spy's samples of
a 16-stream server's engine thread. When `max_batch + max_waiting` jobs are already in, `submit` refuses the
next one at once.

Cancelling a job (its consumer went away, or the engine stops) takes it out of the queue, or out of
the batch before the next step: the other requests lose nothing. The server (`server/worker.py`)
subclasses it to count what happens in its metrics (the `_on_*` hooks).
"""

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.engine import Engine, Event, Failed, Finished

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cancelled:
    """The job stopped before finishing: its client went away or the server is stopping."""


JobEvent = Event | Cancelled


class QueueFull(Exception):
    """The engine already has as many jobs as it accepts."""


class EngineCancelled(Exception):
    """The job was cancelled before it finished (the engine is stopping)."""


class Job:
    """One generation request, created on the event loop and run on the worker thread."""

    def __init__(self, prompt_ids: list[int], params: SamplingParams, spec: SpecConfig) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.spec = spec
        self.queued = time.perf_counter()
        self.first_event: float | None = None  # perf_counter() of its first and latest engine events (worker thread)
        self.last_event: float | None = None
        self.loop = asyncio.get_running_loop()  # where its consumer reads its events
        self._events: asyncio.Queue[JobEvent] = asyncio.Queue()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        self._cancelled.set()

    async def next_event(self) -> JobEvent:
        return await self._events.get()

    def put(self, event: JobEvent) -> None:
        """On its event loop: the next event for `next_event`."""
        self._events.put_nowait(event)


class AsyncEngine:
    """Owns the engine thread, the jobs handed to the engine, and the queue of those not yet handed over."""

    def __init__(self, engine: Engine, max_waiting: int) -> None:
        self.engine = engine
        self.max_waiting = max_waiting
        self._condition = threading.Condition()
        self._submitted: deque[Job] = deque()  # accepted, not yet handed to the engine
        self._jobs: dict[int, Job] = {}  # by engine request id: waiting in the engine or running
        self._stopping = False
        self._outbox: list[tuple[Job, JobEvent]] = []  # events for the jobs' queues, handed over by `_deliver`
        self._thread = threading.Thread(target=self._serve, name="quickdraft-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    async def stream(
        self, prompt_ids: list[int], params: SamplingParams = SamplingParams(), spec: SpecConfig | None = None
    ) -> AsyncIterator[Event]:
        """Submit a job and yield its `TextDelta`s, then its `Finished`; raises the engine's error if it failed,
        `EngineCancelled` if it was cancelled, `QueueFull` at once when the queue is full. Leaving the loop early
        cancels the job."""
        job = Job(prompt_ids, params, spec or self.engine.spec)
        self.submit(job)
        try:
            while True:
                event = await job.next_event()
                if isinstance(event, Failed):
                    raise event.error
                if isinstance(event, Cancelled):
                    raise EngineCancelled("the job was cancelled: the engine is stopping")
                yield event
                if isinstance(event, Finished):
                    return
        finally:
            self.cancel(job)

    def submit(self, job: Job) -> None:
        """Queue a job, or raise `QueueFull` when max_batch running and max_waiting waiting jobs are already in."""
        with self._condition:
            if self._stopping or len(self._submitted) + len(self._jobs) >= self.engine.max_batch + self.max_waiting:
                raise QueueFull
            self._submitted.append(job)
            self._condition.notify()

    def cancel(self, job: Job) -> None:
        """Stop a job wherever it is; a no-op for a job that already finished."""
        job.cancel()
        with self._condition:
            if job in self._submitted:
                self._submitted.remove(job)
                self._on_aborted()
            self._condition.notify()

    def load(self) -> tuple[int, int]:
        """(running, waiting) jobs right now."""
        with self._condition:
            held = len(self._jobs)
            running = min(held, self.engine.max_batch)
            return running, held - running + len(self._submitted)

    def stop(self, timeout: float) -> None:
        """Cancel every job and end the thread after the step in progress (waiting up to `timeout` for it)."""
        self.request_stop()
        self._thread.join(timeout)

    def request_stop(self) -> None:
        """Cancel every job without waiting: after the step in progress each gets `Cancelled`, and the thread ends."""
        with self._condition:
            self._stopping = True
            for job in [*self._submitted, *self._jobs.values()]:
                job.cancel()
            self._condition.notify_all()

    def _serve(self) -> None:
        while self._next_round():
            self._deliver()
            for request_id, event in self.engine.step():
                self._route(request_id, event)
            self._deliver()
            if self.engine.last_step is not None:
                self._on_step(*self.engine.last_step)
        self._cancel_all()
        self._deliver()

    def _next_round(self) -> bool:
        """Wait for work; hand new jobs to the engine, take cancelled ones out. False once stopping."""
        with self._condition:
            while not self._submitted and not self._jobs and not self._stopping:
                self._condition.wait()
            if self._stopping:
                return False
            new, cancelled = list(self._submitted), [i for i, job in self._jobs.items() if job.cancelled]
            self._submitted.clear()
        for request_id in cancelled:
            self._abort(request_id)
        for job in new:
            self._hand_over(job)
        return True

    def _hand_over(self, job: Job) -> None:
        try:
            request_id = self.engine.submit(job.prompt_ids, job.params, spec=job.spec)
        except Exception as exc:  # a prompt the engine refuses (e.g. too long for its context)
            logger.exception("the engine refused a job")
            self._on_failed()
            self._outbox.append((job, Failed(exc)))
            return
        self._on_started(job)
        with self._condition:
            self._jobs[request_id] = job

    def _route(self, request_id: int, event: Event) -> None:
        job, now = self._jobs.get(request_id), time.perf_counter()
        if job is None:  # cancelled earlier in this step's events
            return
        if job.cancelled:  # its consumer left during the step: it gets no more text
            self._abort(request_id)
            return
        self._on_event(job, event, now)
        job.first_event, job.last_event = job.first_event or now, now
        if isinstance(event, Failed):  # the other requests go on
            logger.error("generation failed", exc_info=event.error)
            self._on_failed()
        if isinstance(event, Finished | Failed):
            self._end(request_id, event)
        else:
            self._outbox.append((job, event))

    def _abort(self, request_id: int) -> None:
        """Take a cancelled job out of the engine; it ends with `Cancelled`."""
        self.engine.cancel(request_id)
        self._end(request_id, Cancelled())
        self._on_aborted()

    def _end(self, request_id: int, event: JobEvent) -> None:
        with self._condition:
            job = self._jobs.pop(request_id)
        self._outbox.append((job, event))

    def _cancel_all(self) -> None:
        with self._condition:
            jobs, self._submitted = [*self._submitted, *self._jobs.values()], deque()
            for request_id in self._jobs:
                self.engine.cancel(request_id)
            self._jobs.clear()
        for job in jobs:
            self._on_aborted()
            self._outbox.append((job, Cancelled()))

    def _deliver(self) -> None:
        """Hand the outbox's events to their jobs' event loops, in order: one call per loop."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[Job, JobEvent]]] = {}
        for job, event in self._outbox:
            by_loop.setdefault(job.loop, []).append((job, event))
        self._outbox = []
        for loop, events in by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, events)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass

    # --- what a subclass may count (called on the engine thread, or `_on_aborted` on a caller's) ---

    def _on_started(self, job: Job) -> None:
        """The job was handed to the engine."""

    def _on_event(self, job: Job, event: Event, now: float) -> None:
        """An engine event of the job at perf_counter() `now` (before `job.first_event/last_event` move to it)."""

    def _on_step(self, sequences: int, rows: int) -> None:
        """One engine step ran a target forward over `rows` tokens of `sequences` sequences."""

    def _on_aborted(self) -> None:
        """A job was cancelled before it finished."""

    def _on_failed(self) -> None:
        """A job ended with an error."""


def _put_all(events: list[tuple[Job, JobEvent]]) -> None:
    for job, event in events:
        job.put(event)
