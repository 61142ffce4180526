"""The server package stays importable without torch (the engine imports it at launch)."""

from __future__ import annotations

import subprocess
import sys


def test_server_modules_do_not_import_torch():
    code = ("import sys, sglaunch.server.app, sglaunch.server.launch, sglaunch.server.tokenizer; "
            "sys.exit(int('torch' in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
