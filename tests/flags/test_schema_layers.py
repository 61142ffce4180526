"""The hand-written layer of the schema (`HAND_FLAGS`, `ENV_VARS` in registry.py) agrees with the
facts extracted from SGLang's releases, and the committed index is what the release files give."""

from __future__ import annotations

import pytest

from sglaunch.flags import timeline
from sglaunch.flags.registry import ENV_VARS, GENERATED_FLAGS, HAND_FLAGS, SCHEMA
from sglaunch.flags.spec import Flag, Kind
from sglaunch.releases import KNOWN_RELEASES


def test_hand_layer_agrees_with_the_releases():
    problems = timeline.disagreements(HAND_FLAGS, GENERATED_FLAGS)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("ours, complaint", [
    (Flag("--tp-size", Kind.STR, "x"), "kind is"),
    (Flag("--enable-waterfill", Kind.BOOL, "x", added="0.5.17"), "added is '0.5.17'"),
    (Flag("--dtype", Kind.STR, "x", choices=("auto", "float8")), "hand choices differ"),
    (Flag("--enable-warp-drive", Kind.BOOL, "x"), "no SGLang release we follow has it"),
    (Flag("--model-path", Kind.STR, "x", aliases=("--mp",)), "alias --mp"),
    (Flag("--port", Kind.INT, "x", default=8000), "default 8000 by hand"),
])
def test_a_hand_declaration_that_contradicts_the_data_is_caught(ours, complaint):
    problems = timeline.disagreements((ours,), GENERATED_FLAGS)
    assert any(complaint in p for p in problems), problems


def test_the_committed_index_is_current():
    """sglang/timeline.json is derived from the release files: `python -m sglaunch.flags.timeline`."""
    with open(timeline.os.path.join(timeline.DATA_DIR, timeline.INDEX_NAME), encoding="utf-8") as handle:
        assert handle.read() == timeline.index_text(KNOWN_RELEASES), "run python -m sglaunch.flags.timeline"


def test_every_known_release_has_data():
    assert all(timeline.has_release_data(r) for r in KNOWN_RELEASES)


def test_the_schema_knows_every_spelling_of_every_release():
    for release in KNOWN_RELEASES:
        for entry in timeline.release_data(release)["flags"]:
            for spelling in (entry["name"], *entry["aliases"]):
                assert SCHEMA.lookup(spelling) is not None, (release, spelling)


def test_hand_environment_variables_agree_with_the_releases():
    history = timeline.env_history()["names"]
    for var in ENV_VARS:
        seen = history.get(var.name)
        if not seen:
            continue  # read outside environ.py (CUDA_VISIBLE_DEVICES, ...): nothing to compare
        first, last = KNOWN_RELEASES.index(seen[0]), KNOWN_RELEASES.index(seen[-1])
        assert var.added == (None if first == 0 else seen[0]), var.name
        assert var.removed == (KNOWN_RELEASES[last + 1] if last + 1 < len(KNOWN_RELEASES) else None), var.name


def test_whole_number_variables_match_what_the_engine_refuses():
    """Every `config.env_int(NAME, default, low)` in the engine is declared with at_least=low, so
    check-config refuses (ENV005) exactly the values that would stop the engine at start-up."""
    import ast
    import importlib
    from pathlib import Path

    import sglaunch

    root = Path(sglaunch.__file__).parent
    read = {}
    for path in root.rglob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "env_int"
                 and len(n.args) == 3]
        if not calls:
            continue
        module = importlib.import_module(".".join(path.relative_to(root.parent).with_suffix("").parts))
        for call in calls:
            name = call.args[0]
            value = name.value if isinstance(name, ast.Constant) else getattr(module, name.id)
            read[value] = ast.literal_eval(call.args[2])
    assert read, "no env_int call found"
    declared = {v.name: v.at_least for v in ENV_VARS if v.at_least is not None}
    assert declared == read
