"""`sglaunch version`."""

from __future__ import annotations

import json

from sglaunch import SGLANG_RELEASE, __version__
from sglaunch.cli.common import JsonOption
from sglaunch.releases import KNOWN_RELEASES


def version(as_json: JsonOption = False) -> None:
    info = {"sglaunch": __version__, "sglang_release": SGLANG_RELEASE, "known_releases": list(KNOWN_RELEASES)}
    if as_json:
        print(json.dumps(info))
    else:
        print(f"sglaunch {__version__} (follows SGLang {SGLANG_RELEASE})")
