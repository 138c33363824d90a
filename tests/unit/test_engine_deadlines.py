"""The sidecar's engine without gRPC (real pair store, registry and ranker): Score stops at
its deadline between its steps of work, the text features the ranker derives included."""

from __future__ import annotations

from pathlib import Path

import pytest

from mnemo_server.errors import DeadlineExceeded
from mnemo_sidecar.deadlines import Deadline
from mnemo_sidecar.learning.model import Candidate
from mnemo_sidecar.ranker.text_features import _DERIVED, TEXT_FEATURES
from tests.integration.test_sidecar_deadlines import long_texts
from tests.integration.test_sidecar_models import _promote_a_ranker
from tests.unit.test_sidecar_learning import NAMES, ranker_engine


def test_score_looks_at_its_deadline_while_it_derives_text_features(tmp_path: Path) -> None:
    """Deriving the ranker's text features of 100 texts near inference.max_text_chars is
    ~0.1 s of Python; it used to start after Score's last look at the deadline and run to
    the end, and the answer came back late."""
    _promote_a_ranker(tmp_path)  # a ranker that derives text features, as rankers do
    engine = ranker_engine(tmp_path)
    promoted = engine.ranker("acme")
    assert promoted is not None and set(TEXT_FEATURES) <= set(promoted.model.feature_names)
    texts = long_texts(100, seed=11)
    candidates = [Candidate(f"c{i}", t, 0.5, (0.5, 0.0, 0.1)) for i, t in enumerate(texts)]
    derived = len(_DERIVED)
    with pytest.raises(DeadlineExceeded):
        engine.score("acme", "when did she move?", NAMES, candidates, Deadline(0.005))
    assert len(_DERIVED) - derived < len(texts)  # stopped part-way
    # With time enough, the same call answers.
    scored = engine.score("acme", "when did she move?", NAMES, candidates, Deadline(60.0))
    assert scored.scores is not None and len(scored.scores) == len(texts)
