"""Backends run or forward generation requests and yield typed events."""
