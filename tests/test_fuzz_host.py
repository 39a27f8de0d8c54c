"""The host's outside-input parsers under hypothesis, briefly (CI-sized: well under a minute together);
`make fuzz` runs the same targets for longer (tests/fuzz_host.py, docs/FUZZ.md)."""

import pytest
from fuzz_host_targets import CI, TARGETS


@pytest.mark.slow
@pytest.mark.parametrize("name", list(TARGETS))
def test_any_input_parses_or_is_one_pi2error(name):
    CI(TARGETS[name])()
