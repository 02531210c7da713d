"""The server's engine worker: an `AsyncEngine` that counts what it does in the server's metrics."""

from quickdraft.async_engine import AsyncEngine, Job
from quickdraft.engine import Engine, Event, Finished
from quickdraft.server.metrics import RequestTiming, ServerMetrics


class EngineWorker(AsyncEngine):
    """The engine thread and its queue (`AsyncEngine`), with every job and step counted in `metrics`."""

    def __init__(self, engine: Engine, metrics: ServerMetrics, max_waiting: int) -> None:
        super().__init__(engine, max_waiting)
        self.metrics = metrics

    def _on_started(self, job: Job) -> None:
        self.metrics.count_started(len(job.prompt_ids))

    def _on_event(self, job: Job, event: Event, now: float) -> None:
        if job.last_event is not None:
            self.metrics.observe_inter_token(now - job.last_event)
        if isinstance(event, Finished):
            timing = RequestTiming(job.queued, job.first_event or now, now)
            self.metrics.count_finished(event.finish_reason, event.stats, timing)

    def _on_step(self, sequences: int, rows: int) -> None:
        self.metrics.observe_step(sequences, rows)

    def _on_aborted(self) -> None:
        self.metrics.count_aborted()

    def _on_failed(self) -> None:
        self.metrics.count_failed()
