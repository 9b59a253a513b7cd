"""SparseArch: the embedding tables of a feature spec and their lookups.

One variable per :class:`features.spec.spec.TableConfig`, created inside
:func:`table_creation_scope` so that, under ``ParameterServerStrategy``, the
partitioner (``ps_cluster.cluster.partitioning``) makes it a ``ShardedVariable``
split across the PS tasks. Every step looks up
each table **once**: the ids of all features sharing the table are
concatenated and de-duplicated (``tf.unique``) and passed to
``tf.nn.embedding_lookup``, which gathers from each shard only the rows it
owns. Nothing converts a table to a tensor, so a table is never read whole.
"""

from __future__ import annotations

import collections
import contextlib
import threading
from typing import Iterator

import tensorflow as tf
import tf_keras

from psrec.features.spec.columns import TableConfig
from psrec.features.spec.history import ATTENTION_COMBINERS
from psrec.features.spec.spec import FeatureSpec
from psrec.models.dynamic.shards import ShardLayout
from psrec.models.dynamic.table import DynamicTable
from psrec.models.embedding.quantize import QuantizedTable
from psrec.models.embedding.quantize import quantize_tables
from psrec.models.embedding.table_init import fill_table
from psrec.models.embedding.table_init import fills_in_blocks

WIDE_SUFFIX = "__wide"
_STATE = threading.local()


@contextlib.contextmanager
def table_creation_scope() -> Iterator[None]:
    """Variables created inside this scope are embedding tables."""
    previous = creating_table()
    _STATE.tables = True
    try:
        yield
    finally:
        _STATE.tables = previous


def creating_table() -> bool:
    """True inside :func:`table_creation_scope` (in this thread)."""
    return getattr(_STATE, "tables", False)


def _initializer(table: TableConfig, default_scale: float | None = None
                 ) -> tf_keras.initializers.Initializer:
    """The table's initializer; its scale: the spec's ``scale``, else
    ``default_scale`` (the model's), else ``1/sqrt(dim)``."""
    scale = table.scale
    if scale is None:
        scale = (default_scale if default_scale is not None
                 else table.dim ** -0.5)
    if table.initializer == "uniform":
        return tf_keras.initializers.RandomUniform(-scale, scale)
    if table.initializer == "truncated_normal":
        return tf_keras.initializers.TruncatedNormal(stddev=scale)
    return tf_keras.initializers.Zeros()


def _storage(table: TableConfig) -> dict:
    """``add_weight`` arguments of ``table``'s variable: trainable, in its
    storage dtype, never an AutoCastVariable."""
    return {"trainable": True, "dtype": table.storage, "autocast": False}


def _cast_to(initializer, stored: str):
    """``initializer`` drawing float32 values cast to the ``stored`` dtype
    (the same values a float32 table gets, rounded)."""
    if stored == "float32":
        return initializer

    def initial(shape, dtype=None, **kwargs):
        return tf.cast(initializer(shape, dtype=tf.float32, **kwargs),
                       dtype or stored)
    return initial


def table_variables(variable) -> list[tf.Variable]:
    """The per-shard variables of a table (a plain variable is one shard).

    ``GradientTape.gradient`` rejects a ``ShardedVariable``, so gradients are
    taken with respect to these.
    """
    return list(getattr(variable, "variables", [variable]))


@tf.custom_gradient
def _float32_rows(rows: tf.Tensor):
    """A 16-bit table's rows cast to float32, whose gradient stays float32
    (a plain cast would round it back to 16 bits): the sparse update of a
    16-bit table is computed in float32 (``models.optim.rounding``)."""
    def gradient(upstream):
        return upstream
    return tf.cast(rows, tf.float32), gradient


def _rows_for(rows: tf.Tensor, as_float32: bool, dtype=None) -> tf.Tensor:
    """Gathered ``rows`` as the towers take them: a 16-bit table's in
    float32 (``as_float32``, :func:`_float32_rows`), then cast to ``dtype``
    (the layer's compute dtype) when given."""
    if as_float32:
        rows = _float32_rows(rows)
    return rows if dtype is None else tf.cast(rows, dtype)


def _lookup(table, ids: tf.Tensor, as_float32: bool = False,
            dtype=None) -> tf.Tensor:
    """Rows of ``table`` for int64 ``ids`` of any shape: ``ids.shape + [d]``;
    each distinct id is fetched once, one gather per shard, and only those
    rows are cast (:func:`_rows_for`). ``table``: a (sharded) variable, or
    a :class:`QuantizedTable` (serving)."""
    flat = tf.reshape(ids, [-1])
    unique, index = tf.unique(flat, out_idx=tf.int32)
    if isinstance(table, QuantizedTable):  # float32 rows of the distinct ids
        rows = _rows_for(table.gather(unique), False, dtype)
        return tf.reshape(tf.gather(rows, index),
                          tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0))
    if tf.executing_eagerly() and hasattr(table, "variables"):
        # In eager mode TensorFlow's lookup on a ShardedVariable silently
        # concatenates the whole table on the caller (measured: the model's
        # first call, on the coordinator); the shard list (split as the
        # strategy splits: "div", extra rows first) gathers per shard.
        table = list(table.variables)
    rows = tf.nn.embedding_lookup(table, unique)
    rows = _rows_for(rows, as_float32, dtype)  # the gathered rows only
    gathered = tf.gather(rows, index)
    return tf.reshape(gathered,
                      tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0))


class SparseArch(tf_keras.layers.Layer):
    """Looks up every categorical feature of a spec.

    Call with the batch dict (``feature name -> int64 ids``: ``[B]``, or
    ``[B, L]`` padded with -1 for multi-hot features). Returns a list of
    ``[B, dim]`` embeddings in spec order, and the wide (first-order) logit
    ``[B]`` when every table has a wide twin (else None).

    Args:
      wide: the tables that also get a ``[rows, 1]`` first-order weight
        table, their wide twin ``<table>__wide`` (the model configuration's
        ``wide_tables``: every table of a ranking model with ``wide``, the
        candidate tables of a two-tower model with ``candidate_bias``).
      default_scale: initializer scale of the tables whose spec leaves
        ``scale`` unset (``ModelConfig.init_scale``); None: ``1/sqrt(dim)``.
      serving: ``(tables, dynamic_tables)`` to read instead of creating
        tables (:meth:`with_tables`).
      attention: ``{feature: layer}`` for each history feature with
        ``combiner: din`` or ``bst`` (``models.embedding.attention``; the
        model builds them from its options, ``attention_<feature>``):
        dense layers called with the history's ``[B, L, d]`` rows, its
        ``[B, L]`` mask and its ``of`` feature's ``[B, d]`` embedding (the
        target), returning the pooled ``[B, d]``; a wide part, if any,
        takes the history's mean.
    """

    def __init__(self, spec: FeatureSpec,
                 wide: tuple[str, ...] = (),
                 default_scale: float | None = None,
                 serving: tuple[dict, dict] | None = None,
                 attention: dict[str, tf_keras.layers.Layer] | None = None,
                 **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.spec = spec
        self.attention = dict(attention or {})
        attended = {f.name for f in spec.categorical
                    if f.combiner in ATTENTION_COMBINERS}
        if set(self.attention) != attended:
            raise ValueError(f"attention layers for {sorted(self.attention)}"
                             f"; the spec attends {sorted(attended)}")
        #: The tables with a wide twin, in spec order.
        self.wide_tables = tuple(t.name for t in spec.tables
                                 if t.name in wide)
        self._by_table = collections.defaultdict(list)
        for feature in spec.categorical:
            self._by_table[feature.table].append(feature)
        # Every weight is made here (or handed in), none by build(): the
        # layer is built once constructed, as the SavedModel writer expects
        # of a layer it serialises (else it skips it with a warning).
        self.built = True
        if serving is not None:
            self.tables, self.dynamic_tables = dict(serving[0]), serving[1]
            return
        self.tables = {}
        with table_creation_scope():
            for table in spec.tables:
                # Random tables are created from zeros and filled in blocks
                # of rows on their PS (models.table_init): nothing the size
                # of a table exists twice while it is initialised.
                initializer = _initializer(table, default_scale)
                in_blocks = fills_in_blocks(initializer)
                # A 16-bit table (and its wide twin) is stored as such; no
                # table is wrapped in an AutoCastVariable by a mixed policy,
                # whose lookup would read and cast the WHOLE table every
                # step (measured: docs/benchmarks.md, bf16 towers): the
                # gathered rows are cast instead (_lookup).
                stored = _storage(table)
                self.tables[table.name] = self.add_weight(
                    name=table.name, shape=(table.rows, table.dim),
                    initializer="zeros" if in_blocks else _cast_to(
                        initializer, table.storage), **stored)
                if in_blocks:
                    fill_table(self.tables[table.name], initializer,
                               label=f"init {table.name}")
                if table.name in self.wide_tables:
                    name = table.name + WIDE_SUFFIX
                    self.tables[name] = self.add_weight(
                        name=name, shape=(table.rows, 1),
                        initializer="zeros", **stored)
        # Raw ids -> rows of the `mode: dynamic` tables (models.dynamic_table).
        self.dynamic_tables = {
            t.name: DynamicTable(t, ShardLayout.of(self.tables[t.name]),
                                 _initializer(t, default_scale))
            for t in spec.tables if t.dynamic}

    def with_tables(self, tables: dict[str, object]) -> "SparseArch":
        """An arch of the same spec that reads ``tables`` (``name -> `` a
        plain variable or a :class:`QuantizedTable`) and this
        arch's dynamic tables (their id -> row maps); for serving only."""
        return SparseArch(self.spec, wide=self.wide_tables,
                          serving=(tables, self.dynamic_tables),
                          attention=self.attention, name=self.name)

    def table_variables(self) -> list[tf.Variable]:
        """All shard variables of all tables (sparse-optimizer variables)."""
        return [v for t in self.tables.values() for v in table_variables(t)]

    def _lookup_table(self, name: str, batch: dict[str, tf.Tensor],
                      features: list | None = None, training: bool = False
                      ) -> tuple[dict[str, tf.Tensor], dict[str, tf.Tensor]]:
        features = features or self._by_table[name]
        ids = [tf.reshape(batch[f.name], [-1]) for f in features]
        sizes = [tf.size(i) for i in ids]
        all_ids = tf.concat(ids, 0)
        safe = tf.maximum(all_ids, 0)  # -1 padding; masked below
        dynamic = self.dynamic_tables.get(name)
        embedded = None  # the table's rows, when the dynamic table read them
        if dynamic is not None and dynamic.gathers_from(self.tables[name]):
            # One round trip per shard: ids -> rows and the gather together.
            embedded, safe = dynamic.embed(self.tables[name], all_ids,
                                           training=bool(training))
        elif dynamic is not None:  # raw ids -> rows; unknown: the default
            safe = dynamic.rows(all_ids, training=bool(training))
        wide = name in self.wide_tables
        tables = [self.tables[name]]
        if wide:
            tables.append(self.tables[name + WIDE_SUFFIX])
        outputs = []
        as_float32 = self.spec.table(name).storage != "float32"
        for i, table in enumerate(tables):
            if i == 0 and embedded is not None:  # its default row dropped
                found = _rows_for(embedded, as_float32, self.compute_dtype)
            else:
                found = _lookup(table, safe, as_float32, self.compute_dtype)
                if dynamic is not None:
                    found = dynamic.drop_default_gradient(
                        found, safe, dynamic.default_row)
            rows = tf.split(found, sizes, axis=0)
            outputs.append({f.name: self._combine(
                f, batch[f.name], r, attend=i == 0)
                for f, r in zip(features, rows)})
        return outputs[0], (outputs[1] if wide else {})

    def pool(self, rows: dict[str, tf.Tensor], keys: dict[str, tf.Tensor],
             wide_rows: dict[str, tf.Tensor] | None = None):
        """What :meth:`call` returns, from rows looked up elsewhere (a split
        export's key-value store): ``rows[name]``, a feature's gathered
        rows (``[B, dim]``, or ``[B, L, dim]`` for a multi-hot feature),
        ``keys[name]`` its ids (only their sign is read: negative is
        padding, masked out of a multi-hot feature) and, when every table
        has a wide twin (a ranking model's ``wide``), ``wide_rows[name]``
        its first-order rows (``[B(, L), 1]``)."""
        def combined(source, attend):
            return {f.name: self._combine(
                f, keys.get(f.name), tf.reshape(source[f.name], [-1, tf.shape(
                    source[f.name])[-1]]), attend)
                for f in self.spec.categorical}

        embeddings = self._attend(combined(rows, True), keys)
        ordered = [embeddings[f.name] for f in self.spec.categorical]
        if not self.wide_tables:
            return ordered, None
        wide = combined(wide_rows, False)
        return ordered, self._wide_logit(wide)

    def _wide_logit(self, wide: dict[str, tf.Tensor]) -> tf.Tensor:
        return tf.add_n(
            [tf.reshape(wide[f.name], [-1]) for f in self.spec.categorical])

    @staticmethod
    def _combine(feature, ids: tf.Tensor, rows: tf.Tensor,
                 attend: bool = True) -> tf.Tensor:
        """A feature's pooled rows; an attended history's (``din``,
        ``bst``) ``[B, L, d]`` rows with padding zeroed when ``attend``
        (:meth:`_attend` pools them; a wide part takes the mean)."""
        width = tf.shape(rows)[-1]
        if not feature.multi_hot:
            return rows
        rows = tf.reshape(rows, [-1, feature.max_length, width])
        mask = tf.cast(ids >= 0, rows.dtype)[:, :, None]
        if feature.combiner in ATTENTION_COMBINERS and attend:
            return rows * mask
        total = tf.reduce_sum(rows * mask, axis=1)
        if feature.combiner == "sum":
            return total
        count = tf.maximum(tf.reduce_sum(mask, axis=1), 1.0)
        return total / count

    def _attend(self, embeddings: dict[str, tf.Tensor],
                keys: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        """``embeddings`` with each attended history pooled by its layer
        with its ``of`` feature's embedding, the target (``keys``: the ids,
        negative = padding)."""
        for name, attention in self.attention.items():
            feature = next(f for f in self.spec.categorical
                           if f.name == name)
            embeddings[name] = attention(
                embeddings[name], keys[name] >= 0,
                embeddings[feature.history.of])
        return embeddings

    def lookup(self, batch: dict[str, tf.Tensor],
               names: tuple[str, ...], training: bool = False
               ) -> tuple[list[tf.Tensor], tf.Tensor | None]:
        """The embeddings of the features ``names`` only, in that order
        (``batch`` needs only those; one lookup per table, as :meth:`call`),
        and the ``[B]`` sum of their wide weights (None when none of their
        tables has a wide twin): what a retrieval tower reads."""
        found, wide = {}, {}
        for table, features in self._by_table.items():
            chosen = [f for f in features if f.name in names]
            if chosen:
                e, w = self._lookup_table(table, batch, chosen, training)
                found.update(e)
                wide.update(w)
        wide_sum = (tf.add_n([tf.reshape(w, [-1]) for w in wide.values()])
                    if wide else None)
        return [found[name] for name in names], wide_sum

    def call(self, batch: dict[str, tf.Tensor], training=None):
        embeddings, wide = {}, {}
        for name in self._by_table:
            e, w = self._lookup_table(name, batch, training=training)
            embeddings.update(e)
            wide.update(w)
        embeddings = self._attend(embeddings, batch)
        ordered = [embeddings[f.name] for f in self.spec.categorical]
        if not wide or len(wide) < len(self.spec.categorical):
            return ordered, None
        return ordered, self._wide_logit(wide)


class ShardedTablesModel(tf_keras.Model):
    """A model over a ``sparse_arch`` (:class:`SparseArch`): its variables
    split between the sparse and the dense optimizer."""

    @contextlib.contextmanager
    def tables_stored_as(self, table_dtype: str) -> Iterator[None]:
        """Inside, the model reads its tables stored as ``table_dtype``
        (``models.embedding.quantize``; its dynamic tables' maps unchanged)
        and its float32 table variables are not part of it, so a SavedModel
        written inside holds only the stored form; the trained arch is back
        afterwards. ``float32``: nothing changes."""
        if table_dtype == "float32":
            yield
            return
        trained = self.sparse_arch
        self.sparse_arch = trained.with_tables(
            quantize_tables(trained, table_dtype))
        try:
            yield
        finally:
            self.sparse_arch = trained

    def embedding_variables(self) -> list[tf.Variable]:
        """Shard variables of every table: trained by the sparse optimizer."""
        return self.sparse_arch.table_variables()

    def dense_variables(self) -> list[tf.Variable]:
        """Every other trainable variable: trained by the dense optimizer."""
        tables = {id(v) for v in self.embedding_variables()}
        return [v for v in self.trainable_variables if id(v) not in tables]
