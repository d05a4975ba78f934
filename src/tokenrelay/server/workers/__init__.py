"""`tokenrelay serve --workers N`: N server processes sharing one listening socket, for upstream-only models.

uvicorn's own supervisor starts the workers (spawned, each importing `tokenrelay.server.workers.app`); the settings the
supervisor resolved reach them as JSON in an environment variable, so every worker serves exactly what the
command line, environment and config file said.
"""
