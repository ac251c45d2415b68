"""Model geometry: layer kinds, dims, bytes and FLOPs per cached object, presets, tiny configs."""
