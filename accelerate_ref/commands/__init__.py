"""The ``accelerate-ref`` command line: ``config``, ``env``, ``launch``, ``test`` (catalog section "Launching")."""
