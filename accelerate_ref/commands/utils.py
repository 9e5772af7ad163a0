"""An argument parser whose options take ``_`` and ``-`` spellings alike (🤗 Accelerate's ``commands.utils``).

``CustomArgumentParser.add_argument("--num_processes")`` also accepts
``--num-processes``; every option given on the command line is recorded in the
namespace's ``nondefault`` set, so a caller can tell a flag from a default
(catalog launch.cli: flags override the config file).

Which options get the second spelling follows 🤗 Accelerate 1.15 exactly, since
a parser's defaults and spellings are what a user's code sees:

* every store (``action`` left out or ``"store"``), ``store_true``,
  ``store_false`` and ``store_const`` option, on the parser or in one of its
  argument groups; other actions (``append``, ``help``, ...) are argparse's own;
* a ``store_true`` option added to the parser itself defaults to None rather
  than False (so ``--debug`` not given reads None); in a group, to False;
* a spelling already listed is not added twice.
"""

from __future__ import annotations

import argparse


def _with_hyphen_spellings(option_strings: list[str]) -> list[str]:
    """Each ``--a_b`` followed by ``--a-b``, no spelling twice."""
    spellings: list[str] = []
    for option in option_strings:
        for spelling in (option, option.replace("_", "-") if option.startswith("--") else option):
            if spelling not in spellings:
                spellings.append(spelling)
    return spellings


def _recorded(action_class: type[argparse.Action]) -> type[argparse.Action]:
    """``action_class`` with both spellings of each option, noting its ``dest`` in ``namespace.nondefault``."""

    class Recorded(action_class):
        def __init__(self, option_strings, *args, **kwargs):
            super().__init__(_with_hyphen_spellings(list(option_strings)), *args, **kwargs)

        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            if not hasattr(namespace, "nondefault"):
                namespace.nondefault = set()
            namespace.nondefault.add(self.dest)

    Recorded.__name__ = Recorded.__qualname__ = f"Recorded{action_class.__name__}"
    return Recorded


RecordedStoreAction = _recorded(argparse._StoreAction)
RecordedStoreTrueAction = _recorded(argparse._StoreTrueAction)
RecordedStoreFalseAction = _recorded(argparse._StoreFalseAction)
RecordedStoreConstAction = _recorded(argparse._StoreConstAction)

#: What each argparse action name becomes (any other action is left alone).
_RECORDED_ACTIONS = {
    "store": RecordedStoreAction,
    "store_true": RecordedStoreTrueAction,
    "store_false": RecordedStoreFalseAction,
    "store_const": RecordedStoreConstAction,
}


def _recording(kwargs: dict) -> dict:
    """``add_argument``'s keywords with a store action replaced by its recorded twin."""
    action = kwargs.get("action", "store")
    if isinstance(action, str) and action in _RECORDED_ACTIONS:
        kwargs["action"] = _RECORDED_ACTIONS[action]
    return kwargs


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group whose store options take both spellings and are recorded in ``nondefault``."""

    def add_argument(self, *args, **kwargs):
        return super().add_argument(*args, **_recording(kwargs))


class CustomArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose store options take both spellings and are recorded in ``nondefault``; a
    ``store_true`` option added here (not in a group) defaults to None (see the module docstring)."""

    def add_argument(self, *args, **kwargs):
        if kwargs.get("action") == "store_true":
            kwargs.setdefault("default", None)
        return super().add_argument(*args, **_recording(kwargs))

    def add_argument_group(self, *args, **kwargs):
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group
