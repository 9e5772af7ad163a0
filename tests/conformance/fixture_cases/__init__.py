"""Cases that misbehave on purpose, to test the runner's diagnosis (not part of the suite)."""
