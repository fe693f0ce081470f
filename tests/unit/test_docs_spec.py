"""docs/spec.md is the project's copy of the shared product contract: its contract part must
stay word for word what the shared copy says (when the shared copy is present)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared" / "spec.md"
DOCS = REPO / "docs" / "spec.md"
SEPARATOR = "\n---\n\n## Where retryd departs from or adds to this contract"


def test_docs_spec_has_the_contract_and_the_departures() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert text.startswith("# retryd product contract")
    assert SEPARATOR in text


@pytest.mark.skipif(not SHARED.exists(), reason="the shared contract is not next to this checkout")
def test_docs_spec_is_in_step_with_the_shared_contract() -> None:
    contract = DOCS.read_text(encoding="utf-8").split(SEPARATOR)[0]
    assert contract.rstrip() == SHARED.read_text(encoding="utf-8").rstrip()
