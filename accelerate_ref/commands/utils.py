"""An argument parser whose options take ``_`` and ``-`` spellings alike (🤗 Accelerate's ``commands.utils``).

``CustomArgumentParser.add_argument("--num_processes")`` also accepts
``--num-processes``; every option given on the command line is recorded in the
namespace's ``nondefault`` set, so a caller can tell a flag from a default
(catalog launch.cli: flags override the config file).
"""

from __future__ import annotations

import argparse


def _with_hyphen_spellings(option_strings: list[str]) -> list[str]:
    spellings = []
    for option in option_strings:
        spellings.append(option)
        if option.startswith("--") and "_" in option[2:]:
            spellings.append(option.replace("_", "-"))
    return spellings


def _recorded(action_class: type[argparse.Action]) -> type[argparse.Action]:
    """``action_class`` with both spellings of each option, noting its ``dest`` in ``namespace.nondefault``."""

    class Recorded(action_class):
        def __init__(self, option_strings, *args, **kwargs):
            super().__init__(_with_hyphen_spellings(option_strings), *args, **kwargs)

        def __call__(self, parser, namespace, values, option_string=None):
            super().__call__(parser, namespace, values, option_string)
            if not hasattr(namespace, "nondefault"):
                namespace.nondefault = set()
            namespace.nondefault.add(self.dest)

    Recorded.__name__ = f"Recorded{action_class.__name__}"
    return Recorded


_RECORDED = {
    "store": _recorded(argparse._StoreAction),
    "store_true": _recorded(argparse._StoreTrueAction),
    "store_const": _recorded(argparse._StoreConstAction),
}


def _recording_action(kwargs: dict) -> dict:
    action = kwargs.get("action", "store")
    if isinstance(action, str) and action in _RECORDED:
        kwargs["action"] = _RECORDED[action]
    return kwargs


class CustomArgumentGroup(argparse._ArgumentGroup):
    """An argument group whose options take both spellings and are recorded in ``nondefault``."""

    def add_argument(self, *args, **kwargs):
        return super().add_argument(*args, **_recording_action(kwargs))


class CustomArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose options take both spellings and are recorded in ``nondefault``."""

    def add_argument(self, *args, **kwargs):
        super().add_argument(*args, **_recording_action(kwargs))

    def add_argument_group(self, *args, **kwargs):
        group = CustomArgumentGroup(self, *args, **kwargs)
        self._action_groups.append(group)
        return group
