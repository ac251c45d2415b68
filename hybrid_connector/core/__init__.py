"""The vocabulary every layer shares: keys and hashes, sizes, object metadata, the config schema."""
