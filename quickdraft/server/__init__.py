"""OpenAI-compatible HTTP server over one engine: `create_app(settings)` and `attach_engine(app, engine)`."""

from quickdraft.server.app import attach_engine, create_app, end_jobs
from quickdraft.server.settings import ServerSettings

__all__ = ["ServerSettings", "attach_engine", "create_app", "end_jobs"]
