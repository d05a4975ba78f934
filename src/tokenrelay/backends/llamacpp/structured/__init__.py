"""Structured outputs and tool calling on the embedded engine: grammars, constrained sampling, tool-call text."""
