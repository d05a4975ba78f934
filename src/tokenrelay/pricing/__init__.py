"""Prices per model and node, and what a call costs in integer micro-units of one currency."""
