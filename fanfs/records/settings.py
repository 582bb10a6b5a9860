"""Presentation settings: what a mount shows of layered records, each declared by the record kind that follows it.

A kind whose files can be shown at a chosen view declares one :class:`Setting` (JPEG records: ``fidelity``;
float records: ``precision``).  Its name is everything else's name for it: ``--NAME`` on the command line
(``mount``, ``stage``, ``ctl``, ``info``, ``job run``, ``job serve``), ``FANFS_NAME`` in a Slurm job, the
control socket's key, a key of every :class:`Presentation`.  Its values are ints up to :data:`FULL` (inode
numbers and shared memory hold them), written and read by the kind's own ``format`` and ``parse``: the
syntax of a value is the kind's, whatever codes it uses inside that range.

A value that only the store can tell (``fidelity auto:0.95``) parses to an :class:`Auto`; a higher layer
registers the resolver of that setting (:func:`register_resolver`: :mod:`fanfs.tune` for fidelity, which
this layer may not import), and :func:`resolve` turns a whole set of parsed values into a presentation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from ..errors import UsageError

FULL = 0xFFFF
"""The view "everything": the original bytes (or, for a JPEG record, the whole progressive file)."""


@dataclass(frozen=True)
class Auto:
    """A value of ``setting`` that the store decides (``auto:0.95``): ``argument`` is what the resolver is given."""

    setting: str
    argument: float
    text: str  # as the user wrote it

    def __str__(self) -> str:
        return self.text


Value = int | Auto
Resolver = Callable[[Any, Auto, int | None], tuple[int, str]]
"""``resolver(store, auto, processes) -> (value, note)``: ``processes`` it may fork to measure (1: none, as in an
MPI rank or a training process; None: its choice); ``note`` says what was chosen, for the user."""


@dataclass(frozen=True)
class Setting:
    """One presentation setting, as the kind that follows it declares it."""

    name: str  # fidelity: --fidelity, FANFS_FIDELITY, a Presentation key
    metavar: str  # K|full|auto:SSIM
    help: str  # what a value does, for --help
    parse: Callable[[str], Value]  # a value as written; ValueError with a one-line reason
    format: Callable[[int], str]  # the inverse, for messages and status lines
    rank: Callable[[int], Any] = int  # a sort key from the least data shown to the most (a schedule rises along it)

    @property
    def option(self) -> str:
        return "--" + self.name

    @property
    def variable(self) -> str:
        """The environment variable of a Slurm job's setting."""
        return "FANFS_" + self.name.upper()


_SETTINGS: dict[str, Setting] = {}
_ORDER: dict[str, int] = {}  # setting -> id of the first kind that declared it: settings are listed in that order
_RESOLVERS: dict[str, Resolver] = {}


def register_setting(setting: Setting, kind_id: int) -> None:
    """Called by :func:`fanfs.records.register` for a kind's setting (several kinds may share one object)."""
    known = _SETTINGS.get(setting.name)
    if known is not None and known is not setting:
        raise ValueError(f"two different settings named {setting.name!r}")
    _ORDER[setting.name] = min(kind_id, _ORDER.get(setting.name, kind_id))
    _SETTINGS[setting.name] = setting
    ordered = sorted(_SETTINGS.values(), key=lambda known: _ORDER[known.name])
    _SETTINGS.clear()
    _SETTINGS.update((known.name, known) for known in ordered)
    Presentation.NAMES = tuple(_SETTINGS)


def settings() -> tuple[Setting, ...]:
    """Every setting, in the order of the kinds that declared them."""
    return tuple(_SETTINGS.values())


def setting(name: str) -> Setting:
    """The setting called ``name``; UsageError naming the others if there is none."""
    try:
        return _SETTINGS[name]
    except KeyError:
        raise UsageError(f"a mount's settings are {', '.join(_SETTINGS)}, not {name!r}") from None


def register_resolver(name: str, resolver: Resolver) -> None:
    """Who turns ``name``'s :class:`Auto` values into values (a layer above the records, at its import)."""
    _RESOLVERS[name] = resolver


class Presentation(dict):
    """A mount's value of every setting (FULL where none was chosen): ``Presentation(fidelity=5)``.

    A read-only mapping from setting names to ints.  A dict underneath, so that ``presentation["fidelity"]``,
    which a kind looks up on every FUSE lookup, costs what a dict lookup costs, and JSON takes it as it is.
    """

    NAMES: tuple[str, ...] = ()
    """The settings' names (set as kinds register)."""

    __slots__ = ()

    def __init__(self, values: Mapping[str, int] | Iterable[tuple[str, int]] = (), /, **more: int) -> None:
        given = {**dict(values), **more}
        unknown = set(given) - set(self.NAMES)
        if unknown:
            raise UsageError(f"a presentation sets {', '.join(self.NAMES)}; not {', '.join(sorted(unknown))}")
        super().__init__((name, given.get(name, FULL)) for name in self.NAMES)

    @classmethod
    def from_values(cls, values: Iterable[int]) -> Presentation:
        """From the values in :attr:`NAMES` order (what shared memory holds)."""
        return cls(zip(cls.NAMES, values))

    def __getattr__(self, name: str) -> int:
        """``presentation.fidelity``: a setting's value as an attribute too (not on the hot path: a kind reads
        ``presentation[name]``)."""
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def replace(self, **changes: int) -> Presentation:
        return Presentation(self, **changes)

    def describe(self, chosen_only: bool = False) -> str:
        """``fidelity 5, precision full``: for logs and messages, each value in its kind's own words
        (``chosen_only``: leave out the settings at full)."""
        return ", ".join(f"{name} {_SETTINGS[name].format(value)}" for name, value in self.items()
                         if not (chosen_only and value == FULL))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_presentation, (dict(self),))

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(tuple(self.items()))

    def _read_only(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a Presentation is read-only: use replace()")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _read_only  # type: ignore


def _presentation(values: dict[str, int]) -> Presentation:
    return Presentation(values)


def parse(name: str, text: str) -> Value:
    """``text`` as a value of the setting ``name`` (its kind's syntax); UsageError with the kind's reason."""
    try:
        return setting(name).parse(text)
    except ValueError as err:
        raise UsageError(str(err)) from None


def parse_level(name: str, value: int | str) -> int:
    """A level of a schedule or a candidate of a choice: an int as it is, text (``"1/4"``, ``"full"``) parsed by the
    setting's kind; UsageError for anything else (``auto`` values need a store: not a level)."""
    parsed = parse(name, value) if isinstance(value, str) else value
    if type(parsed) is not int or not 0 < parsed <= FULL:
        raise UsageError(f"a {name} level is a value of the setting (e.g. 4, 1/4 or full), not {value!r}")
    return parsed


def parse_all(texts: Mapping[str, Any]) -> dict[str, Value]:
    """Values of the settings given (None: not given, left out); text is parsed by its kind, anything else taken as
    it is (:func:`fanfs.records.check_presentation` refuses what is no value)."""
    return {name: parse(name, text) if isinstance(text, str) else text for name, text in texts.items()
            if text is not None}


def resolve(store: Any, values: Mapping[str, Value], processes: int | None = None,
            note: Callable[[str], None] = lambda text: None) -> Presentation:
    """The presentation ``values`` ask for, :class:`Auto` ones resolved against ``store`` (each resolver's note
    to ``note``).  Not yet checked against the store's files: :func:`fanfs.records.check_presentation`."""
    resolved = {}
    for name, value in values.items():
        if isinstance(value, Auto):
            resolver = _RESOLVERS.get(name)
            if resolver is None:
                raise UsageError(f"{name} {value} cannot be resolved here")
            value, said = resolver(store, value, processes)
            note(said)
        resolved[name] = value
    return Presentation(resolved)


def unresolved(values: Mapping[str, Value]) -> dict[str, Auto]:
    """The values that need the store."""
    return {name: value for name, value in values.items() if isinstance(value, Auto)}
