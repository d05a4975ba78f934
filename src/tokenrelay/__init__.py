"""tokenrelay: an OpenAI-compatible inference gateway."""

__version__ = "0.1.0"
