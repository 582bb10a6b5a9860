"""The options record kinds declare, on every command that takes them: presentation settings (``mount``,
``stage``, ``ctl``, ``info``, ``job run``, ``job serve``), pack and select options; and a presentation
resolved against its store.  Nothing here names a setting or an option: they come from the registry."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from typing import Any

from ..records import Auto, Presentation, Value, resolve, settings, unresolved


def adder(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> Callable[..., Any]:
    """``parser.add_argument`` for a kind's declarations: a ``type=`` that raises ValueError is reported with its
    message (argparse alone would say only "invalid value")."""

    def add(*flags: str, **kwargs: Any) -> Any:
        convert = kwargs.get("type")
        if convert is not None:
            def checked(text: str) -> Any:
                try:
                    return convert(text)
                except ValueError as err:
                    raise argparse.ArgumentTypeError(str(err)) from None
            checked.__name__ = getattr(convert, "__name__", "value")
            kwargs["type"] = checked
        return parser.add_argument(*flags, **kwargs)

    return add


def add_presentation_options(parser: argparse.ArgumentParser, default: str | None = "full", what: str = "") -> None:
    """``--NAME`` for every setting, parsed by its kind (an int, or an :class:`Auto` the store resolves);
    ``default`` None: an option not given is None (``ctl``, ``job run``).  ``what``: what the command does
    with the presentation, added to each help."""
    add = adder(parser)
    for setting in settings():
        add(setting.option, dest=setting.name, metavar=setting.metavar, type=setting.parse, default=default,
            help=setting.help + what + ("" if default is None else f" (default {default})"))


def presentation_values(args: argparse.Namespace) -> dict[str, Value]:
    """The settings given on the command line (left out: those not given)."""
    return {s.name: getattr(args, s.name) for s in settings() if getattr(args, s.name) is not None}


def resolved(store_path: str, values: Mapping[str, Value], note: Callable[[str], None] = print) -> Presentation:
    """``values`` as a presentation; ``auto`` ones resolved on the store (opened for that alone), each choice
    said through ``note``."""
    if not unresolved(values):
        return Presentation(values)
    from .. import tune  # noqa: F401  (registers the resolvers of auto values)
    from ..store import Store
    store = Store(store_path, check_shards=False)
    try:
        return resolve(store, values, note=note)
    finally:
        store.close()


def known(values: Mapping[str, Value]) -> Presentation:
    """The presentation of ``values`` with the ``auto`` ones left at full (a job resolves them once, for all)."""
    return Presentation({name: value for name, value in values.items() if not isinstance(value, Auto)})


def as_text(values: Mapping[str, Value]) -> dict[str, str]:
    """Values as their kinds write them (to pass them on to another command)."""
    return {s.name: str(values[s.name]) if isinstance(values[s.name], Auto) else s.format(values[s.name])
            for s in settings() if s.name in values}


def note_to_stderr(text: str) -> None:
    print(text, file=sys.stderr)

