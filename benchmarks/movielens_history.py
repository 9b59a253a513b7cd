"""MovieLens 100K, the "like" task (rating >= 4) without and with the
user's history: no history, a mean-pooled history, DIN target attention
over it, and a BST transformer layer over it.

The four specs are the ``movielens`` preset's features with one label,
``like``; the history runs add ``recent_items``, the user's last 50 rated
movies strictly before each rating (``history: {of: item_id, by: user_id,
order: timestamp}``), pooled by ``combiner: mean``, ``din`` or ``bst``
(each at its default sizes). Each is converted with the same time split
(the last 20% of the ratings by ``timestamp`` are the eval split; their
histories hold the earlier train and eval ratings of the user, as a served
request would) and trained by
``psrec train --strategy one-device`` with the same flags (the runs and
the table as ``benchmarks/movielens_multitask.py``)::

    TF_USE_LEGACY_KERAS=1 .venv/bin/python benchmarks/movielens_history.py \\
        --data ../shared/data/movielens-100k --work /tmp/ml-hist
"""

from __future__ import annotations

from movielens_multitask import _cell
from movielens_multitask import arguments
from movielens_multitask import convert_time_split
from movielens_multitask import liked_ratings
from movielens_multitask import run_all

HISTORY = {"name": "recent_items", "dtype": "int64", "max_length": 50,
           "history": {"of": "item_id", "by": "user_id",
                       "order": "timestamp"}}
RUNS = {  # name: (history combiner or None, extra flags)
    "no history": (None, []),
    "history, mean": ("mean", []),
    "history, din": ("din", []),
    "history, bst": ("bst", []),
}


def main() -> None:
    from psrec.features.spec.presets import movielens
    args = arguments(__doc__)
    liked = liked_ratings(args.data, args.work)
    base = movielens().to_dict()
    del base["label"]
    runs = {}
    for name, (combiner, flags) in RUNS.items():
        spec = combiner or "plain"
        history = [] if combiner is None else [{**HISTORY,
                                                "combiner": combiner}]
        folder = convert_time_split(liked, {
            **base, "name": f"movielens-{spec}", "labels": [{"name": "like"}],
            "categorical": base["categorical"] + history}, args.work, spec)
        runs[name] = (folder, flags)
    rows = run_all(args, runs)
    print("| run | like AUC | like logloss |")
    print("|---|---|---|")
    for name, row in rows.items():
        print(f"| {name} | {_cell(row['like_auc'])} | "
              f"{_cell(row['like_logloss'])} |")


if __name__ == "__main__":
    main()
