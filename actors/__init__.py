"""Thin actor shells over the pure logic in ``runtime``: one file per actor of a session."""
