"""The engine of the suite: the case model, where ranks come from, what runs in them, and how outcomes become results.

A new case never needs a change here; a new backend, status or report format does.
"""
