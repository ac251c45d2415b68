"""The facades engines drive: embedded cache, one request's session, TP ranks, the replay gate."""
