"""The shared remote tier: LMCache server, Redis and Redis Cluster stores, chunked large objects, shards, manifests and the backoff guard."""
