"""The popularity baseline of the retrieval evaluation (issue 23): every
candidate ranked by its train-split positives, ties to the lower catalogue
row, scored on the same pairs under the same rule as the model (each pair
against the whole catalogue, nothing excluded); beside the model's figures
in the eval line and the training summary, with a note when the model does
not beat it. The cluster runs are in ``tests/test_retrieval.py``."""

from __future__ import annotations

import dataclasses
import json

import pytest

from psrec.ps_cluster.retrieval.metrics import RetrievalEvalResult
from psrec.ps_cluster.retrieval.metrics import eval_result_from_dict
from psrec.ps_cluster.retrieval.metrics import popularity_baseline
from psrec.ps_cluster.retrieval.metrics import popularity_ranks

# Five candidates (catalogue rows 0-4): train-split positives with two ties
# (rows 1 and 4 at 5, rows 0 and 2 at 3), and the eval pairs of each.
TRAIN = [3, 5, 3, 0, 5]
PAIRS = [2, 1, 1, 4, 1]


def _brute_force(train, pairs, k):
    """Recall@k and MRR pair by pair: a pair's rank is the candidates that
    come first (more train positives, or as many and an earlier row)."""
    hits, reciprocal, total = 0, 0.0, 0
    for candidate, n in enumerate(pairs):
        for _ in range(n):
            rank = sum(1 for other in range(len(train))
                       if train[other] > train[candidate]
                       or (train[other] == train[candidate]
                           and other < candidate))
            hits += rank < k
            reciprocal += 1.0 / (rank + 1)
            total += 1
    return hits / total, reciprocal / total


def test_ranks_break_ties_by_catalogue_row():
    assert popularity_ranks(TRAIN).tolist() == [2, 0, 3, 4, 1]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_baseline_equals_brute_force_with_ties(k):
    baseline = popularity_baseline(TRAIN, PAIRS, ks=(k,))
    recall, mrr = _brute_force(TRAIN, PAIRS, k)
    assert baseline["recall"] == {k: pytest.approx(recall)}
    assert baseline["mrr"] == pytest.approx(mrr)
    # By hand: order rows 1, 4, 0, 2, 3 holding 1, 1, 2, 1, 4 of 9 pairs.
    assert recall == [1 / 9, 2 / 9, 4 / 9, 5 / 9, 1.0][k - 1]
    assert mrr == pytest.approx((1 + 1 / 2 + 2 / 3 + 1 / 4 + 4 / 5) / 9)


def test_no_pair_no_baseline():
    assert popularity_baseline(TRAIN, [0] * 5) is None


def _result(recall100: float, mrr: float) -> RetrievalEvalResult:
    return RetrievalEvalResult(
        count=9, catalogue=5, recall={10: 0.1, 100: recall100}, mrr=mrr,
        popularity={"recall": {10: 0.05, 100: 0.295}, "mrr": 0.025})


def test_eval_line_puts_the_baseline_beside_each_metric():
    result = _result(0.293, 0.03)
    assert result.summary() == (
        "eval: 9 pairs against 5 candidates, recall@10 0.1000 (popularity "
        "0.0500), recall@100 0.2930 (popularity 0.2950), MRR 0.0300 "
        "(popularity 0.0250)")
    assert result.not_above_popularity() == ["recall@100"]
    assert "does not beat the popularity baseline" in (
        result.popularity_note())
    assert "on recall@100:" in result.popularity_note()
    assert _result(0.3, 0.03).popularity_note() is None
    # Saved as JSON (string keys) and read back: the same result.
    again = eval_result_from_dict(json.loads(json.dumps(result.to_dict())))
    assert again == result
    # A result saved before the baseline existed still reads, without it.
    old = result.to_dict()
    del old["popularity"]
    assert eval_result_from_dict(old).summary() == (
        "eval: 9 pairs against 5 candidates, recall@10 0.1000, recall@100 "
        "0.2930, MRR 0.0300")
    assert eval_result_from_dict(old).popularity_note() is None


def _summary_text(result: RetrievalEvalResult, best=None) -> str:
    from psrec.launch.job.summary import JobSummary
    summary = JobSummary(best=best,
        strategy="ps", manifest="m/manifest.json", checkpoint="c/ckpt-80",
        export="w/export/1", tensorboard="w/tb", start_step=0, step=80,
        executed_steps=80, examples_per_sec=1.0, final_loss=0.5,
        eval=result, seconds=1.0, workers=2, ps=1, replicas=1,
        batch_size=32, micro_batches=1, precision="float32",
        closures_per_worker={}, exported_checkpoint="ckpt-80")
    data = json.loads(json.dumps(summary.to_dict()))  # summary.json
    assert data["eval"]["popularity"]["recall"]["100"] == 0.295
    text = JobSummary.from_dict(data).summary()
    assert text == summary.summary()
    return text


def test_summary_notes_a_model_that_does_not_beat_popularity():
    text = _summary_text(_result(0.293, 0.02))
    assert ("  last eval:   step 80: eval: 9 pairs against 5 candidates, "
            "recall@10 0.1000 (popularity 0.0500), recall@100 0.2930 "
            "(popularity 0.2950)") in text
    [note] = [line for line in text.splitlines() if "popularity baseline"
              in line]
    assert note.startswith("  note:        the model does not beat the "
                           "popularity baseline")
    assert "on recall@100, MRR:" in note
    assert "popularity baseline" not in _summary_text(_result(0.3, 0.03))


def test_the_note_is_of_the_exported_best_checkpoint():
    from psrec.ps_cluster.checkpoint.best import BestRecord
    best = BestRecord(  # the last eval is below popularity, the best not
        checkpoint="best/best-40", source="ckpt-40", step=40, metric="mrr",
        value=0.03, auc=None, logloss=None, count=9, metrics={
            "recall@10": 0.1, "recall@100": 0.3, "mrr": 0.03})
    text = _summary_text(_result(0.293, 0.02), best)
    assert ("  best:        step 40, recall@10 0.1000, recall@100 0.3000, "
            "mrr 0.0300 (best/best-40)") in text
    assert "popularity baseline" not in text
    worse = dataclasses.replace(best, metrics={**best.metrics, "mrr": 0.02})
    assert "on MRR:" in _summary_text(_result(0.3, 0.03), worse)
