"""Every spelling SGLang's parser accepts at a release is accepted by our validation at that
release: never "unknown", never "removed" or "not yet added", and its value parsed as SGLang would.
The spellings come straight from the extracted data (`sglaunch/flags/sglang/<release>.json`)."""

from __future__ import annotations

import pytest

from sglaunch.errors import SglaunchError
from sglaunch.flags.registry import SCHEMA
from sglaunch.flags.release_diff import load_release_data
from sglaunch.flags.sources import collect_settings
from sglaunch.releases import KNOWN_RELEASES

WRONG_AT_RELEASE = {"FLAG002", "FLAG003", "FLAG004", "FLAG009", "FLAG016"}
SAMPLES = {"int": "1", "float": "0.5", "json": "{}", "json_list_type": "[]", "human_readable_int": "32k"}


def sample_values(entry: dict) -> list[str]:
    """A value SGLang's argparse takes for this flag (no value for a switch)."""
    nargs = entry.get("nargs")
    if nargs == 0 or nargs in ("?", "*"):
        return []
    choices = entry.get("choices")
    if isinstance(choices, list) and choices and not isinstance(choices[0], dict):
        value = str(choices[0])
    else:
        value = SAMPLES.get(entry.get("type") or "", "x")
    return [value] * (nargs if isinstance(nargs, int) else 1)


def _accepted(entry: dict) -> bool:
    return not (entry.get("deprecated") or {}).get("error") and entry["name"] != "--config"


@pytest.mark.parametrize("release", KNOWN_RELEASES)
def test_no_flag_of_the_release_is_refused(release):
    failures = []
    checked = 0
    for entry in filter(_accepted, load_release_data(release)["flags"]):
        for spelling in (entry["name"], *entry["aliases"]):
            tokens = [spelling, *sample_values(entry)]
            checked += 1
            try:
                _, diagnostics = collect_settings(tokens, {}, SCHEMA, release)
            except SglaunchError as exc:
                failures.append(f"{' '.join(tokens)}: {exc.message}")
                continue
            failures += [f"{' '.join(tokens)}: [{d.code}] {d.message}" for d in diagnostics
                         if d.code in WRONG_AT_RELEASE]
    assert checked > 400
    assert not failures, f"{len(failures)} of {checked} spellings refused at {release}:\n" + "\n".join(failures[:30])


def test_a_flag_of_a_later_release_says_so():
    _, diagnostics = collect_settings(["--enable-response-store"], {}, SCHEMA, "0.5.16")
    (found,) = [d for d in diagnostics if d.code == "FLAG004"]
    assert "added in SGLang 0.5.20" in found.message


def test_a_refused_deprecated_spelling_is_an_error_where_sglang_refuses_it():
    """0.5.18 keeps --enable-expert-distribution-metrics only to stop with 'no longer supported'."""
    _, ok = collect_settings(["--enable-expert-distribution-metrics"], {}, SCHEMA, "0.5.17")
    assert not [d for d in ok if d.code in WRONG_AT_RELEASE]
    _, refused = collect_settings(["--enable-expert-distribution-metrics"], {}, SCHEMA, "0.5.18")
    (found,) = [d for d in refused if d.code == "FLAG003"]
    assert "--expert-balancedness-report-mode" in found.message


@pytest.mark.parametrize("tokens, message", [
    (["--max-total-tokens", "lots"], "expects a token count"),
    (["--max-total-tokens", "1.5Ki"], "expects a token count"),
    (["--preferred-sampling-params", "{not json"], "expects JSON"),
    (["--quantization", "qoq2"], "invalid value 'qoq2'"),
    (["--cuda-graph-bs-decode"], "needs a value"),
])
def test_values_are_checked_as_sglang_parses_them(tokens, message):
    with pytest.raises(SglaunchError) as info:
        collect_settings(tokens, {}, SCHEMA, "0.5.16")
    assert message in info.value.message


def test_human_readable_token_counts_parse_like_sglang():
    settings, _ = collect_settings(["--max-total-tokens", "32k", "--max-prefill-tokens", "2Ki"], {}, SCHEMA, "0.5.16")
    assert settings.get("max_total_tokens") == 32000 and settings.get("max_prefill_tokens") == 2048


def test_negated_switch_turns_the_flag_off():
    """BooleanOptionalAction: --no-X stores False under X."""
    flag = next(f for f in SCHEMA.flags if f.alias_of and f.switch_value is False)
    settings, _ = collect_settings([flag.name], {}, SCHEMA, flag.present_in[-1])
    assert settings.get(SCHEMA.get(flag.alias_of).dest) is False
