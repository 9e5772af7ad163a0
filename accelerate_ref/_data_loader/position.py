"""Where a prepared loader is in its epoch (`DataLoaderPositionMixin`), and its ``get_sampler``/``set_sampler``.

The base, with `adapter.DataLoaderAdapter`, of `data_loader`'s
`DataLoaderShard` and `DataLoaderDispatcher`: what a resumed run needs to
yield what an uninterrupted one would. Catalog: save_state.resume_data_order.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch

from .samplers import SeedableRandomSampler, batching_chain, get_sampler, set_sampler


class _SamplerAccessMixin:
    """HF 1.15's ``get_sampler``/``set_sampler`` of the prepared loaders (see `samplers.get_sampler`)."""

    def get_sampler(self) -> Any:
        return get_sampler(self)

    def set_sampler(self, sampler: Any) -> None:
        set_sampler(self, sampler)


class DataLoaderPositionMixin(_SamplerAccessMixin):
    """Where a prepared loader is in its epoch, so that a resumed run yields what an uninterrupted one would.

    Rules (catalog save_state.resume_data_order):

    * an epoch's order is decided by the loader's order generator (the
      synchronised generator, else the sampler's or the dataset's own);
      its state when the epoch began is recorded, with the number of
      batches handed out since;
    * `state_dict` gives the epoch (``iteration``), whether it has begun,
      the batches handed out in it, the generator state its order starts
      from and a `SeedableRandomSampler`'s seed; `load_state_dict`
      restores them, and the loader is then positioned there;
    * a `skip_first_batches` copy of a positioned loader (one restored by
      `load_state_dict`, or left in the middle of an epoch) continues that
      epoch: it replays the epoch's order from its recorded start, redoes
      none of the epoch's start (no RNG synchronisation, no draw from
      torch's RNG for the iterator's base seed, both of which the
      interrupted run made before it saved), counts its batches in the
      loader's position, and when it completes the epoch the loader moves
      on to the next one. A copy of a loader that is not positioned is a
      loader of its own, as before;
    * an epoch whose last batch has been handed out, its loop not yet
      ended (a save in the epoch's last step, as HF's checkpointing example
      makes every ``checkpointing_steps``), is complete: `state_dict` gives
      the next epoch, not begun, with the order generator as it is now,
      which is where the uninterrupted run's next epoch starts from (the
      epoch's samplers were exhausted before its last batch was handed
      out). So the script's ``skip_first_batches(loader, 0)`` at that epoch
      boundary, and the loader in the epochs after, yield what the
      uninterrupted run's next epochs yielded, not the finished epoch again.
    """

    iteration: int
    #: The positioned loader whose epoch this `skip_first_batches` copy continues, else None.
    _continues: Optional["DataLoaderPositionMixin"] = None
    #: Batches of the epoch this copy leaves out (where it starts in the epoch).
    _skipped: int = 0
    _epoch_started: bool = False
    _epoch_start_rng: Optional[torch.Tensor] = None
    _batches_in_epoch: int = 0
    #: Whether the begun epoch's last batch has been handed out (the epoch is complete; see the class rules).
    _last_handed_out: bool = False
    _restored: bool = False

    @property
    def _positioned(self) -> bool:
        return self._epoch_started or self._restored

    @property
    def _keeper(self) -> "DataLoaderPositionMixin":
        """The loader that keeps the position: the one this copy continues, else itself."""
        return self._continues if self._continues is not None else self

    def _continues_started_epoch(self) -> bool:
        return self._continues is not None and self._continues._epoch_started

    def _epoch_complete(self) -> bool:
        """Whether the begun epoch has handed out its last batch while its loop has not ended yet, so that a run
        saved now resumes at the next epoch (see the class rules). Catalog: save_state.resume_data_order."""
        keeper = self._keeper
        return keeper._epoch_started and keeper._last_handed_out

    def _order_generator(self) -> Optional[torch.Generator]:
        """The generator that decides the order of the loader's batches, if any."""
        candidates = [getattr(self, "synchronized_generator", None)]
        candidates += [getattr(getattr(node, "sampler", None), "generator", None) for node in batching_chain(self)]
        candidates.append(getattr(getattr(self.dataset, "dataset", self.dataset), "generator", None))
        return next((c for c in candidates if isinstance(c, torch.Generator)), None)

    def _seedable_sampler(self) -> Optional[SeedableRandomSampler]:
        samplers = (getattr(node, "sampler", None) for node in batching_chain(self))
        return next((s for s in samplers if isinstance(s, SeedableRandomSampler)), None)

    def _epoch_iterator(self, continuing: bool) -> Iterator[Any]:
        """The epoch's batches (`DataLoaderAdapter`), whose iterator draws a base seed from torch's RNG (not again when continuing)."""
        if not continuing:
            return self._drawn_batches()  # type: ignore[attr-defined]
        state = torch.get_rng_state()
        try:
            return self._drawn_batches()  # type: ignore[attr-defined]
        finally:
            torch.set_rng_state(state)

    def _enter_epoch(self) -> None:
        """Record the start of an epoch, or, continuing a begun one, put its order generator back to that start."""
        keeper, generator = self._keeper, self._order_generator()
        if self._continues_started_epoch():
            if generator is not None and keeper._epoch_start_rng is not None:
                generator.set_state(keeper._epoch_start_rng)
        else:
            keeper._epoch_started = True
            keeper._epoch_start_rng = generator.get_state() if generator is not None else None
        keeper._batches_in_epoch = self._skipped
        keeper._last_handed_out = False

    def _draw_epoch_seed(self) -> None:
        """Seed the order generator from torch's RNG, as HF's RandomSampler without a generator does when an
        epoch's first index is drawn (after the iterator's base seed); the epoch's recorded start follows."""
        generator = self._order_generator()
        generator.manual_seed(int(torch.empty((), dtype=torch.int64).random_().item()))
        self._keeper._epoch_start_rng = generator.get_state()

    def _count_batch(self) -> None:
        """Count a batch handed out in the epoch, noting whether it is the last (``end_of_dataloader``, set before)."""
        keeper = self._keeper
        keeper._batches_in_epoch += 1
        keeper._last_handed_out = bool(getattr(self, "end_of_dataloader", False))

    def _leave_epoch(self) -> None:
        """A completed epoch: the keeper moves on to the next one and holds no position anymore."""
        keeper = self._keeper
        keeper.iteration = self.iteration
        keeper._epoch_started, keeper._epoch_start_rng, keeper._batches_in_epoch, keeper._restored = False, None, 0, False
        keeper._last_handed_out = False

    def state_dict(self) -> dict[str, Any]:
        """The loader's position: epoch, whether it began, batches handed out, order generator state, sampler seed.

        A begun epoch gives the generator state its order started from; a
        complete one (`_epoch_complete`) is given as the next epoch, not
        begun, from the generator as it is now (see the class rules).
        With ``use_stateful_dataloader``, the StatefulDataLoader's state (`DataLoaderAdapter.state_dict`).
        Catalog: save_state.resume_data_order.
        """
        if self.use_stateful_dataloader:  # type: ignore[attr-defined]
            return super().state_dict()  # type: ignore[misc]
        keeper, generator = self._keeper, self._order_generator()
        iteration, started, batches = keeper.iteration, keeper._epoch_started, keeper._batches_in_epoch
        if self._epoch_complete():
            iteration, started, batches = iteration + 1, False, 0
        if started:
            generator_state = keeper._epoch_start_rng
        else:
            generator_state = generator.get_state() if generator is not None else None
        seedable = self._seedable_sampler()
        return {
            "iteration": iteration,
            "epoch_started": started,
            "batches_in_epoch": batches,
            "generator_state": generator_state,
            "sampler_seed": seedable.initial_seed if seedable is not None else None,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Position the loader where `state_dict` says (see the class rules); with ``use_stateful_dataloader``, see
        `DataLoaderAdapter.load_state_dict`. Catalog: save_state.resume_data_order."""
        if self.use_stateful_dataloader:  # type: ignore[attr-defined]
            return super().load_state_dict(state_dict)  # type: ignore[misc]
        generator, seedable = self._order_generator(), self._seedable_sampler()
        if generator is not None and state_dict["generator_state"] is not None:
            generator.set_state(state_dict["generator_state"])
        if seedable is not None and state_dict["sampler_seed"] is not None:
            seedable.initial_seed = state_dict["sampler_seed"]
        self.iteration = state_dict["iteration"]
        self._epoch_started = state_dict["epoch_started"]
        self._epoch_start_rng = state_dict["generator_state"] if self._epoch_started else None
        self._batches_in_epoch = state_dict["batches_in_epoch"]
        self._last_handed_out = False
        self._restored = True


__all__ = ["DataLoaderPositionMixin"]
