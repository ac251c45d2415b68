"""The facades engines drive: the ``CacheAPI`` protocol (``api``), the embedded cache
(``cache``), one request's session and its progress record (``session``, ``progress``), TP
ranks (``ranks``), the suffix-replay gate, and the simulator's request loop and the tuners'
size-only twin caches (``simulator``, ``tuner_caches``)."""
