"""The cache server's wire format (no I/O): LMCache's ``lm://`` frames plus hybrid commands.

``frames``: headers, command codes, limits and the body layout; ``messages``: the typed
bodies of the hybrid commands; ``convert``: plans and results to and from messages.
"""
