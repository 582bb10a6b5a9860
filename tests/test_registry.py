"""Issue 18: a record kind brings its own presentation setting, pack options and info line through the registry.

A new kind, declared here the way a module of fanfs/records/ declares one (a setting whose values are
``1/N``, codes of its own; a pack option), is registered in a process of its own and found everywhere
without a line of fanfs outside fanfs/records/ knowing it: every command that takes a presentation, a
Slurm job's settings and serve step, ``fanfs ctl``'s and ``stats``' words for it, pack's kinds, ``info``.
"""

from __future__ import annotations

import json
import subprocess
import sys

SCRIPT = r'''
import argparse, contextlib, io, json, sys
from fanfs.records import FULL, Presentation, RecordKind, Setting, kind_named, pack_kinds, register, settings


def parse_sharpness(text):
    text = text.strip().lower()
    if text == "full":
        return FULL
    if text.startswith("1/") and text[2:].isdigit() and 1 < int(text[2:]) < 64:
        return 0x8000 | int(text[2:])  # the kind's own codes, inside the range of every setting
    raise ValueError(f"bad sharpness {text!r}: use 1/N (N from 2 to 63) or full")


SHARPNESS = Setting(name="sharpness", metavar="1/N|full", help="toy records: shown at 1/N of their sharpness",
                    parse=parse_sharpness, format=lambda value: "full" if value == FULL else f"1/{value & 0x7fff}")


@register
class ToyRecords(RecordKind):
    kind_id = 9
    name = "toy"
    label = "toy records"
    setting = SHARPNESS

    def __init__(self, scales=None):
        self.scales = scales

    @classmethod
    def pack_options(cls, add):
        add("--toy-scales", metavar="N,N", type=lambda text: [int(n) for n in text.split(",")],
            help="store toy records at these scales too")

    @classmethod
    def for_pack(cls, options, plan_record):
        return cls(options["toy_scales"]) if options.get("toy_scales") else None

    def summary(self, described):
        return f" (scales: {described['scales']})"


from fanfs.cli.main import build_parser
from fanfs.cli.presentation import as_text, presentation_values
from fanfs.cluster.batch import JobSettings
from fanfs.cli.job import job_help

parser = build_parser()
found = {}
for command, operands in ((["mount"], ["S", "M"]), (["stage"], ["S", "L"]), (["ctl"], ["M"]), (["info"], ["S"]),
                          (["job", "run"], ["S", "cmd"]), (["job", "serve"], ["S"])):
    args = parser.parse_args([*command, "--sharpness", "1/4", *operands])
    found[" ".join(command)] = presentation_values(args).get("sharpness")
args = parser.parse_args(["pack", "src", "store", "--toy-scales", "2,4"])
kinds = pack_kinds(vars(args), {})
with contextlib.redirect_stderr(io.StringIO()) as err:
    try:
        parser.parse_args(["mount", "S", "M", "--sharpness", "3"])
    except SystemExit as exit:
        refused = (exit.code, err.getvalue().strip().splitlines()[-1])
print(json.dumps({
    "found": found, "refused": refused,
    "names": list(Presentation.NAMES), "options": [s.option for s in settings()],
    "described": Presentation(sharpness=0x8004).describe(chosen_only=True),
    "serve": JobSettings(nodes=2, replicas=1, presentation=as_text({"sharpness": 0x8004})).serve_command(["fanfs"], "S"),
    "job_help": "FANFS_SHARPNESS" in job_help(),
    "packed": [(kind.name, getattr(kind, "scales", None)) for kind in kinds],
    "info_line": kind_named("toy").summary({"scales": [2, 4]}),
}))
'''


def test_a_new_kind_is_found_everywhere_through_the_registry():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["found"] == {"mount": 0x8004, "stage": 0x8004, "ctl": 0x8004, "info": 0x8004, "job run": 0x8004,
                            "job serve": 0x8004}
    assert out["refused"][0] == 2 and "bad sharpness '3': use 1/N" in out["refused"][1]
    assert out["names"] == ["fidelity", "precision", "sharpness"] and "--sharpness" in out["options"]
    assert out["described"] == "sharpness 1/4"
    assert out["serve"][out["serve"].index("--sharpness") + 1] == "1/4" and out["job_help"]
    assert out["packed"] == [["extent", None], ["toy", [2, 4]]]  # extents are on unless --no-extents
    assert out["info_line"] == " (scales: [2, 4])"
