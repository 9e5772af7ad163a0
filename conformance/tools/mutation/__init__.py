"""Mutation testing of ``accelerate_ref`` against the conformance suite (issue 24), driven through cosmic-ray.

* :mod:`.plan`: the map of each module to the suite's slice that covers it (``conformance/mutation.toml``), the
  reviewed equivalent mutants (``conformance/mutation_equivalent.toml``) and the seeded draw of mutants;
* :mod:`.session`: one cosmic-ray session per module, run mutant by mutant under a time budget, sources kept safe;
* :mod:`.report`: the counts, kill rate and surviving mutants, as JSON and Markdown;
* :mod:`.cli`: ``python -m conformance mutation``.
"""
