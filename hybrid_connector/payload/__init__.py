"""The bytes of every cached object, one description for every engine.

``layout`` (what a KV chunk, a state checkpoint and an anchor block hold per rank: part
names, shapes, dtypes, order), ``parts`` (a payload's parts packed back to back: offsets,
pack/unpack), ``paged`` (a KV chunk gathered from / scattered into paged engine caches).
"""
