"""Split serving export (``psrec export --split``): a dense SavedModel and
the embedding tables as Parquet, full or as a delta on a published split
version (``--delta-since``). The bundle's layout and Parquet format:
:mod:`psrec.models.serving.bundle`; what serving does with it:
``docs/checkpoints-and-export.md`` ("Split export").

The SavedModel (``model/``) has two signatures:

* ``keys``: the raw inputs of the all-in-one export (the same tensors,
  :func:`~psrec.models.serving.export.serving_signature`) -> per categorical
  feature its int64 keys, ``[batch]`` or ``[batch, max_length]`` (multi-hot,
  padded with -1): the hashing and vocabulary lookups of
  ``features.transforms``, so a client computes no hash itself. A hashed
  table's key is its row, a dynamic table's the raw 64-bit id.
* ``serving_default``: per dense feature its raw values (``[batch]``
  float32, NaN = missing); per categorical feature ``F`` the rows of its
  keys, ``F`` ``[batch(, max_length), dim]``, with a wide part also
  ``F__wide`` ``[batch(, max_length), 1]`` (the table ``T__wide``), and for
  a multi-hot feature its keys ``F__keys`` (padding, negative, is masked)
  -> ``{"probability", "logit"}``, as the all-in-one export computes them.

Neither holds a table: the tables are the Parquet files, streamed from the
restored model a block of rows at a time (a dynamic table's admitted rows
in raw-id order).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import tensorflow as tf

from psrec.errors import ConfigError
from psrec.features.spec.spec import FeatureSpec
from psrec.features.transforms.ops import CategoricalEncoder
from psrec.models.dynamic.table import FREE
from psrec.models.embedding.sparse_arch import WIDE_SUFFIX
from psrec.models.ranking.model import RankingModel
from psrec.models.serving.bundle import DEFAULT_KEY
from psrec.models.serving.bundle import FORMAT
from psrec.models.serving.bundle import MODEL_DIR
from psrec.models.serving.bundle import ROW_GROUP_ROWS
from psrec.models.serving.bundle import Block
from psrec.models.serving.bundle import Bundle
from psrec.models.serving.bundle import DiffCounts
from psrec.models.serving.bundle import TableWriter
from psrec.models.serving.bundle import chain_of
from psrec.models.serving.bundle import deleted_file
from psrec.models.serving.bundle import diff
from psrec.models.serving.bundle import load_bundle
from psrec.models.serving.bundle import publish_bundle
from psrec.models.serving.bundle import table_file
from psrec.models.serving.bundle import table_state
from psrec.models.serving.bundle import write_manifest
from psrec.models.serving.export import dense_batch
from psrec.models.serving.export import encode_ids
from psrec.models.serving.export import serving_signature
from psrec.models.serving.versions import check_root
from psrec.models.serving.versions import next_version
from psrec.uri_path import as_path

#: Input name suffixes of the dense signature (``F__wide``, ``F__keys``).
WIDE_INPUT, KEYS_INPUT = WIDE_SUFFIX, "__keys"


def dense_signature(spec: FeatureSpec, wide: bool) -> dict[str, tf.TensorSpec]:
    """The inputs of the dense signature (module docstring)."""
    inputs = {f.name: tf.TensorSpec([None], tf.float32, name=f.name)
              for f in spec.dense}
    for feature in spec.categorical:
        batch = [None, feature.max_length] if feature.multi_hot else [None]
        dim = spec.table(feature.table).dim
        inputs[feature.name] = tf.TensorSpec(batch + [dim], tf.float32,
                                             name=feature.name)
        if wide:
            name = feature.name + WIDE_INPUT
            inputs[name] = tf.TensorSpec(batch + [1], tf.float32, name=name)
        if feature.multi_hot:
            name = feature.name + KEYS_INPUT
            inputs[name] = tf.TensorSpec(batch, tf.int64, name=name)
    return inputs


class SplitServingModule(tf.Module):
    """The ``keys`` and ``serving_default`` functions of the module
    docstring, over the model's dense layers only (its tables are not
    tracked, so a SavedModel of this module holds none)."""

    def __init__(self, model: RankingModel, spec: FeatureSpec,
                 logit_shift: float = 0.0) -> None:
        super().__init__(name="psrec_split_serving")
        self.layers = model.dense_layers()
        self.encoder = CategoricalEncoder(spec)
        self.logit_shift = tf.Variable(float(logit_shift), trainable=False,
                                       dtype=tf.float32, name="logit_shift")
        arch, head, encoder = model.sparse_arch, model.head, self.encoder
        shift = self.logit_shift

        def keys(raw):
            return encode_ids(encoder, spec, raw)

        def dense(inputs):
            rows = {f.name: inputs[f.name] for f in spec.categorical}
            ids = {f.name: inputs[f.name + KEYS_INPUT]
                   for f in spec.categorical if f.multi_hot}
            wide = ({f.name: inputs[f.name + WIDE_INPUT]
                     for f in spec.categorical} if arch.wide_tables else None)
            embeddings, wide_logit = arch.pool(rows, ids, wide)
            logit = tf.cast(head(embeddings, wide_logit,
                                 dense_batch(spec, inputs)), tf.float32)
            logit += shift
            return {"probability": tf.sigmoid(logit), "logit": logit}

        self.keys = tf.function(keys,
                                input_signature=[serving_signature(spec)])
        self.dense = tf.function(dense, input_signature=[
            dense_signature(spec, bool(arch.wide_tables))])


def table_blocks(model: RankingModel, name: str,
                 block_rows: int = ROW_GROUP_ROWS) -> Iterator[Block]:
    """The rows of table ``name`` (``T`` or ``T__wide``) of a model with
    plain variables, key-sorted, ``block_rows`` at a time: a hashed table's
    every row by index; a dynamic table's admitted rows by raw id, its
    default row first (key :data:`DEFAULT_KEY`)."""
    arch = model.sparse_arch
    variable = arch.tables[name]
    dynamic = arch.dynamic_tables.get(name.removesuffix(WIDE_SUFFIX))
    if dynamic is None:
        for start in range(0, int(variable.shape[0]), block_rows):
            block = variable[start:start + block_rows].numpy()
            yield np.arange(start, start + len(block), dtype=np.int64), block
        return
    ids = dynamic.row_ids.numpy()
    used = np.flatnonzero(ids != FREE)
    rows = used[np.argsort(ids[used], kind="stable")]
    for start in range(0, rows.size, block_rows):
        chosen = rows[start:start + block_rows]
        yield ids[chosen], tf.gather(variable, chosen).numpy()


class _Counted:
    """Blocks passed through, their rows counted."""

    def __init__(self, blocks: Iterator[Block]) -> None:
        self.blocks, self.rows = blocks, 0

    def __iter__(self) -> Iterator[Block]:
        for keys, vectors in self.blocks:
            self.rows += keys.size
            yield keys, vectors


def _table_entry(model: RankingModel, name: str) -> dict:
    base = name.removesuffix(WIDE_SUFFIX)
    dynamic = base in model.sparse_arch.dynamic_tables
    entry = {"name": name, "file": table_file(name),
             "mode": "dynamic" if dynamic else "hashed",
             "key": "raw_id" if dynamic else "row",
             "dim": int(model.sparse_arch.tables[name].shape[1]),
             "dtype": "float32"}
    if dynamic:
        entry["default_key"] = DEFAULT_KEY
    return entry


def _features(spec: FeatureSpec, wide: bool) -> dict[str, dict]:
    return {f.name: {"table": f.table,
                     "wide_table": f.table + WIDE_SUFFIX if wide else None,
                     "max_length": f.max_length, "combiner": f.combiner}
            for f in spec.categorical}


def _write_tables(model: RankingModel, folder: str,
                  chain: list[Bundle] | None) -> dict[str, dict]:
    tables = {}
    for name in model.sparse_arch.tables:
        entry = _table_entry(model, name)
        current = _Counted(table_blocks(model, name))
        upserts = TableWriter(as_path(folder) / entry["file"], name,
                              entry["dim"])
        deletes = None
        try:
            if chain is None:
                for keys, vectors in current:
                    upserts.write(keys, vectors)
            else:
                _check_same_table(chain[-1], entry)
                if entry["mode"] == "dynamic":
                    entry["deleted_file"] = deleted_file(name)
                    deletes = TableWriter(as_path(folder) / deleted_file(name),
                                          name, None)
                counts = DiffCounts()
                for (keys, vectors), gone in diff(
                        table_state(chain, name), current, entry["dim"],
                        counts):
                    upserts.write(keys, vectors)
                    if deletes is not None:
                        deletes.write(gone)
                entry.update(changed=counts.changed, admitted=counts.admitted,
                             deleted=counts.deleted)
        finally:
            upserts.close()
            if deletes is not None:
                deletes.close()
        entry["rows"] = current.rows
        if chain is not None:
            entry["delta_rows"] = upserts.rows
        tables[name] = entry
    return tables


def _check_same_table(base: Bundle, entry: dict) -> None:
    found = base.manifest["tables"].get(entry["name"])
    if found is None or (found["dim"], found["mode"]) != (entry["dim"],
                                                          entry["mode"]):
        raise ConfigError(
            f"table {entry['name']} is not in {base.describe()} as it is now "
            f"({entry['mode']}, dim {entry['dim']}); a delta needs the same "
            "tables: publish a full split export (no --delta-since).")


def publish_split(model: RankingModel, spec: FeatureSpec, root: str | Path,
                  info: dict, version: int | None = None,
                  delta_since: int | None = None) -> Bundle:
    """Publishes a split bundle of ``model`` as ``root/<version>`` (None:
    the next version): full, or with ``delta_since`` the rows changed since
    that split version of ``root`` (full or itself a delta). ``info``: the
    manifest's ``step``, ``checkpoint``, ``logit_shift``, ... .

    Raises:
      ConfigError: ``delta_since`` no split version of ``root``, one of
        another spec or other tables; ``version`` exists (exit 2).
      DataError: a file of the base does not match its manifest (exit 1).
    """
    root = str(root)
    check_root(root)
    version = version or next_version(root)
    chain = None
    manifest = {"format": FORMAT, "kind": "full", "version": version, **info,
                "model": MODEL_DIR,
                "features": _features(
                    spec, bool(model.sparse_arch.wide_tables))}
    if delta_since is not None:
        base = load_bundle(as_path(root) / str(delta_since))
        chain = chain_of(base, root)
        if base.manifest.get("spec_hash") != info.get("spec_hash"):
            raise ConfigError(
                f"--delta-since {delta_since}: {base.describe()} was exported "
                "from another spec; publish a full split export (no "
                "--delta-since).")
        for bundle in chain:
            bundle.verify()
        manifest.update(kind="delta", base=base.state)

    def write(folder: str) -> None:
        module = SplitServingModule(model, spec, info.get("logit_shift", 0.0))
        tf.saved_model.save(module, str(as_path(folder) / MODEL_DIR),
                            signatures={"serving_default": module.dense,
                                        "keys": module.keys})
        write_manifest(folder, {**manifest, "tables": _write_tables(
            model, folder, chain)})

    return load_bundle(publish_bundle(root, version, write))
