"""`tokenrelay serve | keys | usage`."""
