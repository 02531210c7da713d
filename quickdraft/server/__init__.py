"""OpenAI-compatible HTTP server over one engine: `app.create_app(settings)` and `app.attach_engine(app, engine)`.

Nothing is imported here, so that the CLI, which reads `settings` to build its parser, runs without loading the
web framework (or having it, where only generation is wanted).
"""
