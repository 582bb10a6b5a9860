"""A selection plan: which codec each content class gets, as chosen by ``fanfs select``; ``pack --plan`` takes it.

The plan file is JSON::

    {"fanfs_plan": 1,                       # format version; any other value is refused
     "fanfs": "0.1.0", "created": "...", "host": "...", "source": "...",
     "constraint": {...},                   # what the choice was made for (mode, rate, threads, ...)
     "classes": {"text": {"codec": {"id": "zstd", "level": 19, "dict": "text"},
                          "ratio": 4.9, "decode_MBps": 812.0, "measured": true},
                 "float": {"codec": {"id": "zstd", "level": 3},    # optional "record": the files become
                           "record": {"kind": "float", "elf": false, "error": null}, ...}, ...},  # float records
     "dictionaries": {"text": "<base64 of the zstd dictionary>"}}

For pack it is a codec table with one entry per class in :data:`fanfs.classify.CLASSES` order (two
classes with the same codec still get two entries, so the store's per-codec statistics are per class);
``codec_index(data)`` classifies a file by its first bytes.  A class the plan does not name (not seen
in the sample) gets a conservative default: ``raw`` for JPEG, PNG and already compressed data, fast
``lz4`` otherwise.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from typing import Any

from .classify import CLASSES, classify
from ..codecs import Codec, CodecError, codec_from_config
from ..errors import FanfsError, UsageError
from ..records import kind_named
from ..util.files import read_regular

PLAN_VERSION = 1
DEFAULTS: dict[str, dict[str, Any]] = {
    "jpeg": {"id": "raw"}, "png": {"id": "raw"}, "compressed": {"id": "raw"},
    "float": {"id": "lz4", "level": 0}, "text": {"id": "lz4", "level": 0}, "binary": {"id": "lz4", "level": 0},
}


def _record_problem(name: str, record: Any) -> str | None:
    """Why class ``name`` cannot name ``record`` (the kind it names says); None if it can."""
    if not isinstance(record, Mapping) or not isinstance(record.get("kind"), str):
        return 'a record is {"kind": NAME, ...}'
    try:
        kind = kind_named(record["kind"])
    except UsageError as err:
        return str(err)
    return kind.plan_record_problem(name, record)


class PlanError(UsageError):
    """A plan file that this fanfs cannot use (one-line reason)."""


class Plan:
    def __init__(self, classes: Mapping[str, Mapping[str, Any]], dictionaries: Mapping[str, bytes] | None = None,
                 info: Mapping[str, Any] | None = None) -> None:
        """``classes``: class -> {"codec": config, and optionally "ratio", "decode_MBps", "measured"}."""
        unknown = sorted(set(classes) - set(CLASSES))
        if unknown:
            raise PlanError(f"plan names unknown content class {unknown[0]!r}; this fanfs knows {', '.join(CLASSES)}")
        self._dictionaries = {str(k): bytes(v) for k, v in (dictionaries or {}).items()}
        self.info = dict(info or {})
        self.table: dict[str, dict[str, Any]] = {}
        self._codecs: list[Codec] = []
        for name in CLASSES:
            entry = dict(classes.get(name) or {"codec": DEFAULTS[name], "measured": False})
            config = entry.get("codec")
            if not isinstance(config, Mapping):
                raise PlanError(f"plan class {name!r} has no codec config")
            try:
                codec = codec_from_config(config, self._dictionaries)
            except CodecError as err:
                raise PlanError(f"plan class {name!r}: {err}") from None
            except (TypeError, ValueError) as err:
                raise PlanError(f"plan class {name!r}: bad codec config {dict(config)!r}: {err}") from None
            entry["codec"] = codec.get_config()
            record = entry.get("record")
            problem = _record_problem(name, record) if record is not None else None
            if problem:
                raise PlanError(f"plan class {name!r}: bad record {record!r} ({problem})")
            self.table[name] = entry
            self._codecs.append(codec)
        self._index = {name: i for i, name in enumerate(CLASSES)}

    # --- what pack uses ------------------------------------------------------------------------------
    def codecs(self) -> list[Codec]:
        return list(self._codecs)

    def codec_index(self, data: bytes) -> int:
        return self._index[classify(data)]

    def record(self, name: str) -> dict[str, Any] | None:
        """The record form a class's files take (float records, lossless or ELF), or None: as they are."""
        return self.table[name].get("record")

    def records(self) -> dict[str, dict[str, Any]]:
        """Kind name -> the record a class names for it (what ``fanfs pack --plan`` makes of that class's files)."""
        return {record["kind"]: record for entry in self.table.values() if (record := entry.get("record"))}

    def dictionaries(self) -> dict[str, bytes]:
        used = {c["codec"].get("dict") for c in self.table.values()}
        return {k: v for k, v in self._dictionaries.items() if k in used}

    def classes(self) -> tuple[str, ...]:
        """Content classes in codec-table order: class ``classes()[i]`` uses ``codecs()[i]``."""
        return CLASSES

    def describe(self) -> dict[str, Any]:
        """What the store's index records (``meta["plan"]``): class -> codec index and predicted ratio."""
        return {
            "fanfs_plan": PLAN_VERSION,
            "constraint": self.info.get("constraint"),
            "classes": {name: {"codec_index": i, "codec": self.table[name]["codec"],
                               "predicted_ratio": self.table[name].get("ratio"),
                               "record": self.table[name].get("record"),
                               "measured": bool(self.table[name].get("measured", True))}
                        for i, name in enumerate(CLASSES)},
        }

    # --- files ----------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"fanfs_plan": PLAN_VERSION, **{k: v for k, v in self.info.items() if k != "fanfs_plan"},
                "classes": self.table,
                "dictionaries": {k: base64.b64encode(v).decode("ascii") for k, v in self.dictionaries().items()}}

    def save(self, path: str) -> None:
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(self.to_json(), f, indent=2)
            f.write("\n")
        os.replace(tmp, path)

    @classmethod
    def from_json(cls, data: Any, where: str = "plan") -> "Plan":
        if not isinstance(data, dict) or "fanfs_plan" not in data:
            raise PlanError(f"{where} is not a fanfs plan (no \"fanfs_plan\" field): make one with fanfs select -o")
        if data["fanfs_plan"] != PLAN_VERSION:
            raise PlanError(f"{where} is a version {data['fanfs_plan']!r} plan; this fanfs reads version "
                            f"{PLAN_VERSION}: re-run fanfs select")
        classes = data.get("classes")
        if not isinstance(classes, dict):
            raise PlanError(f"{where} has no \"classes\" table")
        dictionaries: dict[str, bytes] = {}
        for name, text in (data.get("dictionaries") or {}).items():
            try:
                dictionaries[name] = base64.b64decode(text, validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise PlanError(f"{where}: dictionary {name!r} is not valid base64") from None
        info = {k: v for k, v in data.items() if k not in ("classes", "dictionaries")}
        try:
            return cls(classes, dictionaries, info)
        except PlanError as err:
            raise PlanError(f"{where}: {err}") from None

    @classmethod
    def load(cls, path: str) -> "Plan":
        try:
            text = read_regular(path, limit=1 << 28)
        except OSError as err:
            raise PlanError(f"cannot read plan {path}: {err.strerror}") from None
        except FanfsError as err:
            raise PlanError(f"cannot read plan: {err}") from None
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as err:
            raise PlanError(f"{path} is not a fanfs plan (not JSON: {err})") from None
        return cls.from_json(data, path)
