"""The token radix tree and its records: what the index and the policies walk."""
