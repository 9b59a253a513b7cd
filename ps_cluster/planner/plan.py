"""Sharding planner: the bytes every PS task will hold, before any starts.

Under ``ParameterServerStrategy`` each embedding table (and the ``[rows, 1]``
wide table of DeepFM / Wide & Deep) is cut by :class:`TablePartitioner`
into shards, and the strategy places shard variables on PS tasks
round-robin, with one counter over every variable it creates. The first
are the three step counters ``tf_keras.Model.__init__`` creates (train,
test, predict); then come the tables, in spec order, each followed by its
wide table: shard ``i`` of a table whose first shard is variable number
``c`` (from 0) lands on PS ``(c + i) % ps``. Rows follow the "div" split:
``rows // shards`` each, the first ``rows % shards`` shards one row more.
A table's values take the bytes of its dtype (``TableConfig.dtype``: 4
float32, 2 bfloat16; its wide twin the same), and the partitioner
cuts it by those bytes. The slots of each table's optimizer (the one its
spec names, else ``--sparse-optimizer``; ``models.optim.config.slot_values``:
Adagrad 1, FTRL 2, SGD 0 of the shard's size; row-wise Adagrad one
``[shard_rows, 1]``), float32 whatever the table's dtype, sit beside their
shard, on its PS (``models.optim.config.row_bytes``). Dense weights
and their slots are counted whole on every PS (an upper bound, small beside
the tables). ``plan(...).max_ps_bytes`` is the memory one PS task needs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from psrec.errors import ConfigError
from psrec.errors import check
from psrec.features.spec.columns import TableConfig
from psrec.features.spec.spec import FeatureSpec
from psrec.models.embedding.sparse_arch import WIDE_SUFFIX
from psrec.models.embedding.sparse_arch import table_creation_scope
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.config import row_bytes
from psrec.models.optim.config import slots as slots_of
from psrec.models.optim.config import table_groups
from psrec.models.optim.sizing import dense_parameter_count
from psrec.models.ranking.config import ModelConfig
from psrec.ps_cluster.cluster.partition_config import PartitionConfig
from psrec.ps_cluster.cluster.partitioning import TablePartitioner

VALUE_BYTES = 4  # float32 dense variables and slots
MAX_PLANNED_PS = 1024  # the largest PS count min_ps looks at
#: Variables the strategy creates before the first table: the train, test
#: and predict counters of ``tf_keras.Model``. Checked against the real
#: placement by tests/test_planner.py.
FIRST_TABLE_VARIABLE = 3
_UNITS = (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20),
          ("KiB", 1 << 10))


class PsMemoryError(ConfigError):
    """A PS task would hold more than its memory budget (exit 2)."""


def format_bytes(count: int | float) -> str:
    """``1.50 GiB``, ``12.0 MiB``, ``800 B``: binary units, 3 digits."""
    for unit, size in _UNITS:
        if count >= size:
            value = count / size
            return (f"{value:.0f} {unit}" if value >= 100
                    else f"{value:.3g} {unit}")
    return f"{int(count)} B"


@dataclasses.dataclass(frozen=True)
class TableShard:
    """One shard variable of a table.

    Attributes:
      table: the variable's name (``<table>`` or ``<table>__wide``).
      index: the shard's index in its table (``part_<index>``).
      row_offset: the table row of the shard's first row.
      ps: the PS task that holds the shard and its slots.
      slot_bytes: its optimizer slots' bytes.
    """

    table: str
    index: int
    row_offset: int
    rows: int
    dim: int
    ps: int
    bytes: int
    slot_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.bytes + self.slot_bytes

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "total_bytes": self.total_bytes}


@dataclasses.dataclass(frozen=True)
class TablePlan:
    """A table variable (``rows`` x ``dim``), its optimizer and its shards,
    in order."""

    name: str
    rows: int
    dim: int
    shards: tuple[TableShard, ...]
    optimizer: str = OptimizerConfig.sparse
    value_bytes: int = VALUE_BYTES  # of its dtype (TableConfig.dtype)

    @property
    def row_bytes(self) -> int:
        """Bytes of one row with its optimizer slots."""
        return row_bytes(self.optimizer, self.dim, self.value_bytes)

    @property
    def bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def slot_bytes(self) -> int:
        return sum(s.slot_bytes for s in self.shards)

    def to_dict(self) -> dict:
        return {"name": self.name, "rows": self.rows, "dim": self.dim,
                "optimizer": self.optimizer, "row_bytes": self.row_bytes,
                "bytes": self.bytes, "slot_bytes": self.slot_bytes,
                "shards": [s.to_dict() for s in self.shards]}


@dataclasses.dataclass(frozen=True)
class ShardingPlan:
    """Where every table shard goes and what each PS task holds.

    Attributes:
      optimizer: ``--sparse-optimizer``, of the tables that name none
        (each :class:`TablePlan` has its own).
      tables: every table variable, in creation order.
      dense_bytes: dense weights and their slots, counted on every PS.
      ps_bytes: per PS task: its shards, their slots, ``dense_bytes`` and
        the maps and row statistics of its dynamic table shards
        (``planner_dynamic``).
      ps_memory: the budget of one PS task (None: no budget).
      min_ps: the smallest PS count (up to ``MAX_PLANNED_PS``) whose
        ``max_ps_bytes`` fits ``ps_memory``; None without a budget or when
        none fits.
    """

    ps: int
    optimizer: str
    partition: PartitionConfig
    tables: tuple[TablePlan, ...]
    dense_bytes: int
    ps_bytes: list[int]
    ps_memory: int | None = None
    min_ps: int | None = None
    table_dtypes: tuple[str, ...] = ("float32",)

    @property
    def max_ps_bytes(self) -> int:
        return max(self.ps_bytes)

    @property
    def largest_shard(self) -> TableShard:
        """The shard with the most bytes (with its slots)."""
        shards = [s for t in self.tables for s in t.shards]
        return max(shards, key=lambda s: s.total_bytes)

    @property
    def fits(self) -> bool:
        return self.ps_memory is None or self.max_ps_bytes <= self.ps_memory

    def shards_on(self, ps: int) -> list[TableShard]:
        return [s for t in self.tables for s in t.shards if s.ps == ps]

    def to_dict(self) -> dict:
        return {"ps": self.ps, "optimizer": self.optimizer,
                "partition": dataclasses.asdict(self.partition),
                "tables": [t.to_dict() for t in self.tables],
                "dense_bytes": self.dense_bytes, "ps_bytes": self.ps_bytes,
                "max_ps_bytes": self.max_ps_bytes,
                "largest_shard": self.largest_shard.to_dict(),
                "ps_memory": self.ps_memory, "fits": self.fits,
                "min_ps": self.min_ps,
                "table_dtypes": list(self.table_dtypes)}

    def refusal(self) -> str:
        """The one-line reason this plan does not fit (:func:`check_plan`)."""
        worst = self.ps_bytes.index(self.max_ps_bytes)
        if self.min_ps is not None:
            fix = (f"the smallest PS count that fits is {self.min_ps}: use "
                   f"--ps {self.min_ps} (or raise --ps-memory)")
        else:
            fix = (f"no PS count up to {MAX_PLANNED_PS} fits (largest shard "
                   f"{_shard_name(self.largest_shard)} "
                   f"{format_bytes(self.largest_shard.total_bytes)} with "
                   f"slots, dense part {format_bytes(self.dense_bytes)} on "
                   "every PS): raise --ps-memory or --table-shards")
        return (f"PS {worst} of {self.ps} would hold "
                f"{format_bytes(self.max_ps_bytes)} of table shards, "
                f"optimizer slots and dense weights, over `--ps-memory`"
                f" = {format_bytes(self.ps_memory)}; {fix}.")


def _shard_name(shard: TableShard) -> str:
    return f"{shard.table}/part_{shard.index}"


def table_variables(spec: FeatureSpec, model: ModelConfig
                    ) -> list[tuple[str, int, int]]:
    """``(name, rows, dim)`` of every table variable the model creates, in
    creation order: each table, then its wide twin when the model has one
    (``model.wide_tables``)."""
    variables = []
    wide = model.wide_tables(spec)
    for table in spec.tables:
        variables.append((table.name, table.rows, table.dim))
        if table.name in wide:
            variables.append((table.name + WIDE_SUFFIX, table.rows, 1))
    return variables


def _table_of(spec: FeatureSpec, variable: str) -> TableConfig:
    """The spec table of the table variable ``variable`` (a table or its
    wide twin, stored in the table's dtype)."""
    return spec.table(variable.removesuffix(WIDE_SUFFIX))


def variable_optimizers(spec: FeatureSpec, optimizer: OptimizerConfig
                        ) -> dict[str, str]:
    """Table variable name (wide twins too) -> the optimizer that trains it:
    its table's own, else ``optimizer.sparse``."""
    groups = table_groups(spec.tables, optimizer)
    return {name: groups[name].optimizer for name in groups} | {
        name + WIDE_SUFFIX: group.optimizer for name, group in groups.items()}


def shard_rows(rows: int, num_ps: int, partition: PartitionConfig,
               dim: int, dtype: str = "float32") -> list[int]:
    """Rows of each shard of a ``[rows, dim]`` table of ``dtype``, as
    :class:`TablePartitioner` and the strategy's "div" split cut it."""
    with table_creation_scope():
        parts = TablePartitioner(partition, num_ps)(
            tf.TensorShape([rows, dim]), tf.as_dtype(dtype))[0]
    parts = min(parts, rows)
    base, extra = divmod(rows, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def _tables(spec: FeatureSpec, model: ModelConfig, num_ps: int,
            partition: PartitionConfig, optimizers: dict[str, str]
            ) -> tuple[TablePlan, ...]:
    counter, tables = FIRST_TABLE_VARIABLE, []
    for name, rows, dim in table_variables(spec, model):
        optimizer = optimizers[name]
        shards, offset = [], 0
        table = _table_of(spec, name)
        stored = table.value_bytes
        for index, count in enumerate(shard_rows(
                rows, num_ps, partition, dim, table.storage)):
            size = stored * count * dim
            shards.append(TableShard(
                table=name, index=index, row_offset=offset, rows=count,
                dim=dim, ps=counter % num_ps, bytes=size,
                slot_bytes=count * row_bytes(optimizer, dim, stored) - size))
            offset += count
            counter += 1
        tables.append(TablePlan(name, rows, dim, tuple(shards), optimizer,
                                stored))
    return tuple(tables)


def _max_ps_bytes(spec: FeatureSpec,
                  variables: list[tuple[str, int, int]], num_ps: int,
                  partition: PartitionConfig, optimizers: dict[str, str],
                  dense: int, dynamic: frozenset[str]) -> int:
    """``max_ps_bytes`` of a plan on ``num_ps`` PS tasks, without building
    it (``min_ps`` tries up to ``MAX_PLANNED_PS`` counts)."""
    counter = FIRST_TABLE_VARIABLE
    per_ps = np.full(num_ps, float(dense))
    for name, rows, dim in variables:
        table = _table_of(spec, name)
        rows_each = np.asarray(shard_rows(rows, num_ps, partition, dim,
                                          table.storage), dtype=np.float64)
        sizes = rows_each * row_bytes(optimizers[name], dim,
                                      table.value_bytes)
        if name in dynamic:  # its maps and statistics, shard by shard
            sizes += dynamic_table_bytes(rows_each)
        places = (counter + np.arange(len(sizes))) % num_ps
        per_ps += np.bincount(places, weights=sizes, minlength=num_ps)
        counter += len(sizes)
    return int(per_ps.max())


def _min_ps(spec: FeatureSpec, model: ModelConfig,
            optimizer: OptimizerConfig, partition: PartitionConfig,
            dense: int, ps_memory: int) -> int | None:
    """The smallest PS count whose fullest PS fits ``ps_memory``."""
    if dense > ps_memory:
        return None
    variables = table_variables(spec, model)
    for num_ps in range(1, MAX_PLANNED_PS + 1):
        if _max_ps_bytes(spec, variables, num_ps, partition,
                         variable_optimizers(spec, optimizer), dense,
                         dynamic_names(spec)) <= ps_memory:
            return num_ps
    return None


def _layout(spec: FeatureSpec, model: ModelConfig, num_ps: int,
            optimizer: OptimizerConfig, partition: PartitionConfig,
            dense_parameters: int) -> ShardingPlan:
    tables = _tables(spec, model, num_ps, partition,
                     variable_optimizers(spec, optimizer))
    dense = VALUE_BYTES * dense_parameters * (1 + slots_of(optimizer.dense))
    ps_bytes = [dense] * num_ps
    dynamic = dynamic_names(spec)
    for table in tables:
        for shard in table.shards:
            ps_bytes[shard.ps] += shard.total_bytes
            if table.name in dynamic:  # + its maps and row statistics
                ps_bytes[shard.ps] += dynamic_table_bytes(shard.rows)
    return ShardingPlan(ps=num_ps, optimizer=optimizer.sparse,
                        table_dtypes=tuple(sorted(
                            {t.storage for t in spec.tables})),
                        partition=partition, tables=tables, dense_bytes=dense,
                        ps_bytes=ps_bytes)


def plan_partition(spec: FeatureSpec, model_config: ModelConfig, ps: int,
                   optimizer: OptimizerConfig = OptimizerConfig(),
                   partition: PartitionConfig = PartitionConfig(),
                   ps_memory: int | None = None,
                   dense_parameters: int | None = None) -> ShardingPlan:
    """:func:`plan` with the full optimizer and partition configurations
    (what ``psrec train`` has)."""
    check(ps >= 1, "ps", ps, "must be >= 1")
    check(ps_memory is None or ps_memory >= 1, "ps_memory", ps_memory,
          "must be >= 1 byte")
    if dense_parameters is None:
        dense_parameters = dense_parameter_count(spec, model_config)
    result = _layout(spec, model_config, ps, optimizer, partition,
                     dense_parameters)
    if ps_memory is None:
        return result
    min_ps = _min_ps(spec, model_config, optimizer, partition,
                     result.dense_bytes, ps_memory)
    return dataclasses.replace(result, ps_memory=ps_memory, min_ps=min_ps)


def plan(spec: FeatureSpec, model_config: ModelConfig, ps: int,
         optimizer: str = OptimizerConfig.sparse, shards: int | None = None,
         partitioner: str = PartitionConfig.kind,
         ps_memory: int | None = None,
         dense_parameters: int | None = None) -> ShardingPlan:
    """Plans the tables of ``spec`` on ``ps`` PS tasks.

    Args:
      model_config: the architecture (wide tables, dense towers): a
        ranking ``ModelConfig`` or a two-tower ``RetrievalConfig``.
      optimizer: the optimizer (its slots) of the tables whose spec names
        none; the dense part's is the default (``OptimizerConfig.dense``).
      shards: shards per table (``--table-shards``; default one per PS).
      partitioner: ``min-size`` (the train default), ``fixed``, ``max-size``.
      ps_memory: bytes one PS task may hold; sets ``fits`` and ``min_ps``.
      dense_parameters: the dense weight count when known (else counted,
        ``models.optim.sizing.dense_parameter_count``).
    """
    return plan_partition(spec, model_config, ps,
                          OptimizerConfig(sparse=optimizer),
                          PartitionConfig(kind=partitioner, shards=shards),
                          ps_memory, dense_parameters)


def check_plan(result: ShardingPlan) -> ShardingPlan:
    """Returns ``result`` when every PS fits its budget; else a
    :class:`PsMemoryError` naming the fullest PS and the PS count that fits."""
    if not result.fits:
        raise PsMemoryError(result.refusal())
    return result


# The text of a :class:`~psrec.ps_cluster.planner.plan.ShardingPlan`: bytes per
# PS task, a row per table shard, the partitioning and the largest shard.

def _partitioning(result: ShardingPlan) -> str:
    partition = result.partition
    cap = partition.shards or result.ps
    if partition.kind == "fixed":
        return f"fixed: {cap} shard(s) per table"
    if partition.kind == "min-size":
        return (f"min-size: ceil(table bytes / "
                f"{format_bytes(partition.min_shard_bytes)}) shards, at most "
                f"{cap} per table")
    return (f"max-size: shards of at most "
            f"{format_bytes(partition.max_shard_bytes)}, up to {cap} per "
            "table")


def _ps_lines(result: ShardingPlan) -> list[str]:
    lines = ["bytes per PS (table shards + optimizer slots + dense part):"]
    for ps, total in enumerate(result.ps_bytes):
        shards = result.shards_on(ps)
        tables = sum(s.bytes for s in shards)
        slots = sum(s.slot_bytes for s in shards)
        lines.append(
            f"  PS {ps}: {format_bytes(total):>10}  ({len(shards)} shard"
            f"{'' if len(shards) == 1 else 's'}: "
            f"{format_bytes(tables)} + slots {format_bytes(slots)} + dense "
            f"{format_bytes(result.dense_bytes)})")
    return lines


def _table_lines(result: ShardingPlan) -> list[str]:
    """One line per table variable: its optimizer and bytes per row."""
    width = max([len(t.name) for t in result.tables] + [5])
    lines = ["tables (bytes per row: values in the table's dtype + float32 "
             "optimizer slots):",
             f"  {'table':<{width}}  {'rows':>12}  {'dim':>4}  "
             f"{'optimizer':<15}  {'bytes/row':>9}  {'with slots':>10}"]
    for table in result.tables:
        lines.append(
            f"  {table.name:<{width}}  {table.rows:>12,}  {table.dim:>4}  "
            f"{table.optimizer:<15}  {table.row_bytes:>9,}  "
            f"{format_bytes(table.bytes + table.slot_bytes):>10}")
    return lines


def _shard_lines(result: ShardingPlan) -> list[str]:
    width = max([len(t.name) for t in result.tables] + [5])
    lines = ["table shards:",
             f"  {'table':<{width}}  shard  {'rows':>12}  {'dim':>4}  PS  "
             f"{'bytes':>10}  {'slots':>10}"]
    for table in result.tables:
        for s in table.shards:
            lines.append(
                f"  {s.table:<{width}}  {s.index:>5}  {s.rows:>12,}  "
                f"{s.dim:>4}  {s.ps:>2}  {format_bytes(s.bytes):>10}  "
                f"{format_bytes(s.slot_bytes):>10}")
    return lines


def plan_text(result: ShardingPlan) -> str:
    """The plan as text (``psrec plan`` without ``--json``)."""
    largest = result.largest_shard
    lines = [f"sharding plan: {result.ps} PS, partitioner "
             f"{_partitioning(result)}, {'/'.join(result.table_dtypes)} "
             f"tables, {result.optimizer} slots (float32) for the tables "
             "that name no optimizer"]
    lines += _ps_lines(result)
    lines += _table_lines(result)
    lines += _shard_lines(result)
    lines.append(
        f"largest shard: {_shard_name(largest)} "
        f"({largest.rows:,} x {largest.dim}) on PS {largest.ps}: "
        f"{format_bytes(largest.total_bytes)} with its slots")
    verdict = f"most on one PS: {format_bytes(result.max_ps_bytes)}"
    if result.ps_memory is not None:
        verdict += (f"; --ps-memory {format_bytes(result.ps_memory)}: "
                    + ("fits" if result.fits else "does NOT fit"))
        if result.min_ps is not None:
            verdict += f" (smallest PS count that fits: {result.min_ps})"
    lines.append(verdict)
    return "\n".join(lines)


# The bytes of the dynamic tables' own state, for the sharding planner. A
# ``mode: dynamic`` table's rows (``capacity + 1``) and their optimizer slots
# are planned as any table's; its maps and row statistics
# (``models.dynamic.shards``) come on top, sized by the rows of each shard:
# the id -> row map and the pending counts hold at most one entry per row
# (the pending counts after each maintenance, which forgets the least seen;
# between two they may grow by the ids of ``maintenance_every`` steps).

HASH_ENTRY_BYTES = 32  # int64 key + int64 value, at ~50% load
ROW_STAT_BYTES = 3 * 8  # row_ids, freq, last_seen


def dynamic_table_bytes(rows: int) -> int:
    """Bytes of the maps and row statistics of ``rows`` rows of a dynamic
    table (one shard's, or a whole table's)."""
    return rows * (2 * HASH_ENTRY_BYTES + ROW_STAT_BYTES)


def dynamic_names(spec: FeatureSpec) -> frozenset[str]:
    """The names of the table variables whose shards carry dynamic state
    (a dynamic table's wide twin has none)."""
    return frozenset(t.name for t in spec.tables if t.dynamic)
