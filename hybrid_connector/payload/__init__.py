"""The bytes of every cached object: spec lists, paged gather/scatter, anchor packing."""
