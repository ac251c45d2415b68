"""Talking to the cache server: the client and the wire format."""
