"""The engine side of server mode: ``ServerCache``, the embedded cache's interface over a
cache server (``hybrid-connector server``)."""
