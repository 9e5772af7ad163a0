"""The `Accelerator`'s process control and collectives, as a mixin: printing once, barriers, running on some
ranks only, splitting inputs, the cross-rank trigger, gather/reduce/pad.

`ProcessControlMixin` is a base of `Accelerator`; it uses the Accelerator's
``state``, ``device``, ``gradient_state`` and ``flag_tensor``. The rules
themselves are the process state's (`state.PartialState`) and the collective
utilities' (`utils.operations`); this module reaches them from the Accelerator
as HF 1.15's methods do.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, Iterator, TypeVar

import torch

from ..logging import get_logger
from ..state import PartialState
from ..utils import operations
from ..utils._operations.structures import recursively_apply

F = TypeVar("F", bound=Callable[..., Any])
#: HF 1.15 logs these methods' messages under its accelerator module's logger.
logger = get_logger("accelerate_ref.accelerator")


class ProcessControlMixin:
    """`print`, `wait_for_everyone`, `main_process_first`, `split_between_processes`, the ``on_*`` decorators,
    `set_trigger`/`check_trigger` and the collective methods of the `Accelerator`."""

    def print(self, *args: Any, **kwargs: Any) -> None:
        """Print once per machine. Catalog: ``print.once_per_server``."""
        self.state.print(*args, **kwargs)

    def wait_for_everyone(self) -> None:
        """Barrier across all ranks. Catalog: ``sync.wait_for_everyone``."""
        PartialState().wait_for_everyone()

    @contextlib.contextmanager
    def main_process_first(self) -> Iterator[None]:
        """Catalog: ``sync.main_process_first``."""
        with self.state.main_process_first():
            yield

    @contextlib.contextmanager
    def local_main_process_first(self) -> Iterator[None]:
        """Catalog: ``sync.local_main_process_first``."""
        with self.state.local_main_process_first():
            yield

    @contextlib.contextmanager
    def split_between_processes(self, inputs: Any, apply_padding: bool = False) -> Iterator[Any]:
        """Catalog: ``split.*``. See `PartialState.split_between_processes`."""
        with PartialState().split_between_processes(inputs, apply_padding=apply_padding) as share:
            yield share

    # -- running on some ranks only --------------------------------------------
    # Rule (HF 1.15): the decorated function is `_inner`, which asks the `PartialState` at each call whether to
    # run. Used on the class instead of an instance (``Accelerator.on_main_process(f)``) the function lands in
    # ``self``: it is taken as the function when its qualified name has ``Accelerator.`` in it (a method of the
    # class), else it is HF's ValueError; on an instance without a function, reading ``self.__qualname__`` is
    # Python's AttributeError.

    def on_main_process(self, function: F | None = None) -> F:
        """Catalog: ``process.on_main_process``."""
        return _run_where(self, "on_main_process", function)

    def on_local_main_process(self, function: F | None = None) -> F:
        """Catalog: ``process.on_local_main_process``."""
        return _run_where(self, "on_local_main_process", function)

    def on_last_process(self, function: F) -> F:
        """Catalog: ``process.on_last_process``."""
        return _run_where(self, "on_last_process", function)

    def on_process(self, function: F | None = None, process_index: int | None = None) -> F:
        """Catalog: ``process.on_process``. HF's refusal names ``on_main_process`` here too."""
        if process_index is not None and function is None:
            return functools.partial(self.on_process, process_index=process_index)
        return _run_where(self, "on_process", function, process_index, named="on_main_process")

    def on_local_process(self, function: F | None = None, local_process_index: int | None = None) -> F:
        """Catalog: ``process.on_local_process``. HF's refusal names ``on_main_process`` here too."""
        if local_process_index is not None and function is None:
            return functools.partial(self.on_local_process, local_process_index=local_process_index)
        return _run_where(self, "on_local_process", function, local_process_index, named="on_main_process")

    # -- triggers ----------------------------------------------------------

    def set_trigger(self) -> None:
        """Raise this rank's flag; the next `check_trigger` on every rank sees it.

        Catalog: ``trigger.set_check`` (erratum: the example calls it ``check_breakpoint``).
        """
        self.flag_tensor = torch.tensor(1, device=self.device)

    def check_trigger(self) -> bool:
        """True on every rank if any rank set the trigger since the last check; then lowered.

        A collective: every rank must call it. The flag is a tensor from the first check on.
        """
        if self.flag_tensor is None:
            self.flag_tensor = torch.tensor(0, device=self.device)
        if self.reduce(self.flag_tensor).item() >= 1:
            self.flag_tensor = torch.tensor(0, device=self.device)
            return True
        return False

    # -- collectives -------------------------------------------------------

    def gather(self, tensor: Any) -> Any:
        """Catalog: ``gather.*``. See `accelerate_ref.utils.gather`."""
        return operations.gather(tensor)

    def reduce(self, tensor: Any, reduction: str = "sum", scale: float = 1.0) -> Any:
        """Reduce across ranks; the Accelerator defaults to ``"sum"`` (the utility to ``"mean"``).

        Catalog: ``reduce.doc_example``, ``reduce.mean``, ``reduce.none``.
        """
        return operations.reduce(tensor, reduction, scale)

    def pad_across_processes(self, tensor: Any, dim: int = 0, pad_index: int = 0, pad_first: bool = False) -> Any:
        """Catalog: ``pad.*``. See `accelerate_ref.utils.pad_across_processes`."""
        return operations.pad_across_processes(tensor, dim=dim, pad_index=pad_index, pad_first=pad_first)

    def gather_for_metrics(self, input_data: Any, use_gather_object: bool = False) -> Any:
        """Gather for metric computation, dropping the samples `even_batches` duplicated.

        Rule: tensors (nested structures of them) are gathered like `gather`;
        anything else, or everything with ``use_gather_object=True``, with
        `gather_object`. On the last batch of a prepared loader whose global
        batch had fewer real samples than ranks times batch size, only the
        first ``remainder`` gathered samples are kept; a loader without a
        length (remainder -1) keeps everything, with HF 1.15's info log.
        Catalog:
        gather_for_metrics.doc_example, gather_for_metrics.tuple,
        gather_for_metrics.use_gather_object, gather_for_metrics.full_epoch.
        """
        use_gather_object = use_gather_object or not _only_tensors(input_data)
        gathered = operations.gather_object(input_data) if use_gather_object else self.gather(input_data)
        try:
            if not self.gradient_state.end_of_dataloader:
                return gathered
            remainder = self.gradient_state.remainder
            if remainder == -1:
                logger.info("The used dataset had no length, returning gathered tensors. You should drop the "
                            "remainder yourself.")
                return gathered
            if remainder == 0:
                return gathered
            if use_gather_object:
                return gathered[:remainder]
            return recursively_apply(lambda tensor: tensor[:remainder], gathered)
        except Exception:  # noqa: BLE001 - HF 1.15 returns the gathered data whatever went wrong in dropping
            return gathered


def _run_where(accelerator: Any, decorator: str, function: Callable | None, *where: Any,
               named: str | None = None) -> Callable:
    """``function`` wrapped in `_inner`, which runs it where ``PartialState().<decorator>`` says (see above).

    ``accelerator`` is ``self`` of the decorator: the function itself when the
    decorator was used on the class; ``named`` the decorator HF's refusal names.
    """
    if function is None:
        if "Accelerator." not in accelerator.__qualname__:
            raise ValueError(f"The `{named or decorator}` decorator must be called with a function on an "
                             "instantiated `Accelerator` object.")
        function = accelerator

    def _inner(*args: Any, **kwargs: Any) -> Any:
        return getattr(PartialState(), decorator)(function, *where)(*args, **kwargs)

    return _inner


def _only_tensors(data: Any) -> bool:
    """Whether every leaf of the nested structure ``data`` is a tensor."""
    try:
        recursively_apply(lambda tensor: tensor, data, error_on_other_type=True)
    except TypeError:
        return False
    return True
