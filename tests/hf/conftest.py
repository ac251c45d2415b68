"""Registers the transformers-runtime fixtures (defined in ``hf_support``, importable by the
test modules under a name no other test area uses)."""

from hf_support import *  # noqa: F403
