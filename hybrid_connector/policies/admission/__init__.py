"""Admission and placement: which states and anchors a request keeps."""
