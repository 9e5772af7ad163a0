"""Cases whose level tags disagree with the API they use: the level check must name the later names.

Registered under ``fixture.`` IDs, outside the suite.
"""

from __future__ import annotations

from conformance.engine.case import case


@case("fixture.level_v1_spelling", worlds=[1], level="docs-0.27")
def tagged_v027_written_with_v1x(impl, world):
    """Tagged docs-0.27, but spelled with the v1.x reference's API."""
    acc = impl.Accelerator(dataloader_config=impl.utils.DataLoaderConfiguration(split_batches=True))
    return acc.gather_for_metrics([world.rank], use_gather_object=True)


@case("fixture.level_v1_spelling_tagged", worlds=[1], level="docs-1.x")
def tagged_v1x_written_with_v1x(impl, world):
    """The same, tagged with the level it is written at."""
    acc = impl.Accelerator(dataloader_config=impl.utils.DataLoaderConfiguration(split_batches=True))
    return acc.gather_for_metrics([world.rank], use_gather_object=True)


def _profiled(impl):
    """A helper of the case's own module: the check follows it."""
    return impl.ProfileKwargs(output_trace_dir="trace")


@case("fixture.level_helper", worlds=[1], level="docs-0.27")
def tagged_v027_through_a_helper(impl, world):
    return _profiled(impl)
