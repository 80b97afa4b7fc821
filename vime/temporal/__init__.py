"""Temporal plumbing: the embedded dev server, client connection, vime's search attributes."""
