"""Tuning Marconi's alpha: grid replays and shadow twins."""
