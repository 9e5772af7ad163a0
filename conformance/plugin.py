"""Placeholder for the conformance pytest plugin (filled in by the suite)."""
