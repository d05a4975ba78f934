"""Thin HTTP routes; the work happens in backends and renderers."""
