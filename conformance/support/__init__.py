"""What the cases use: assertion helpers, small models, launching an implementation's launcher, reading trackers' stores.

Imported by the case modules in `conformance.cases` (and by the project's own
tests); nothing here drives a run.
"""
