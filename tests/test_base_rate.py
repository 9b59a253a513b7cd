"""The trainer starts the model at the train split's base rate, which the
job reads from the manifest (``positives`` recorded at conversion)."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf

from psrec.data.input.config import InputConfig
from psrec.data.input.dataset import make_eval_dataset
from psrec.launch.job.run import _base_rate
from psrec.models.ranking.config import model_config
from psrec.ps_cluster.training.trainer import Trainer


def test_the_job_takes_the_base_rate_of_the_train_split(criteo_data,
                                                        small_criteo_spec):
    manifest, paths = criteo_data
    labels = np.concatenate([pq.read_table(p, columns=["label"])
                             .column("label").to_numpy() for p in paths])
    train_rows = manifest.rows("train")  # the first rows (tail split)
    assert _base_rate(manifest) == labels[:train_rows].sum() / train_rows


def test_an_untrained_trainer_predicts_the_base_rate(criteo_data,
                                                     small_criteo_spec):
    manifest, _ = criteo_data
    rate = _base_rate(manifest)
    files = manifest.files("eval")
    batch = next(iter(make_eval_dataset(files, small_criteo_spec, 512,
                                        manifest.block_rows)))
    for name in ("dcn", "dlrm", "wide_deep"):
        trainer = Trainer(tf.distribute.get_strategy(), small_criteo_spec,
                          model_config(name), input_config=InputConfig(512),
                          positive_rate=rate)
        probs = tf.sigmoid(trainer.model(batch)).numpy()
        np.testing.assert_allclose(probs, rate, rtol=1e-4)
        untouched = Trainer(tf.distribute.get_strategy(), small_criteo_spec,
                            model_config(name),
                            input_config=InputConfig(512))
        # Control: without the rate the start is not the base rate.
        start = tf.sigmoid(untouched.model(batch)).numpy()
        assert not np.allclose(start, rate, rtol=1e-2)
