"""Tools beside the suite: the parity check of public names, the differential harness, HF's shipped scripts, and
running an HF script switched to another implementation."""
