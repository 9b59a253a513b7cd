"""The mirrored path's size guard: bytes of replicated tables + optimizer
slots per device against a fraction of the device memory."""

from __future__ import annotations

import pytest

from psrec.features import criteo
from psrec.features import movielens
from psrec.models.optim.config import OptimizerConfig
from psrec.models.optim.sizing import GIB
from psrec.models.optim.sizing import DeviceMemory
from psrec.models.optim.sizing import ModelTooLargeError
from psrec.models.optim.sizing import SizeEstimate
from psrec.models.optim.sizing import check_fits
from psrec.models.optim.sizing import dense_parameter_count
from psrec.models.optim.sizing import device_memory_bytes
from psrec.models.optim.sizing import estimate_replicated_bytes
from psrec.models.optim.sizing import proxy_spec
from psrec.models.ranking.config import MODEL_PRESETS
from psrec.models.ranking.config import model_config

SIXTEEN_GIB = DeviceMemory("GPU", 16 << 30, "test")


def test_estimate_matches_a_hand_count_of_tables_slots_and_dense_weights():
    spec = criteo(buckets=1000, dim=8)
    # Adagrad on the tables: one accumulator per table entry; Adam on the
    # dense weights: m and v.
    size = estimate_replicated_bytes(spec, model_config("dcn"),
                                     OptimizerConfig(), dense_parameters=500)
    tables = 26 * 1000 * 8 * 4
    assert size == SizeEstimate(table_bytes=tables, table_slot_bytes=tables,
                                dense_bytes=2000, dense_slot_bytes=4000)
    assert size.total_bytes == 2 * tables + 6000
    # A wide model adds a [rows, 1] table; FTRL keeps 2 slots, SGD none.
    wide = estimate_replicated_bytes(
        spec, model_config("deepfm"),
        OptimizerConfig(sparse="ftrl", dense="sgd"), dense_parameters=10)
    wide_tables = 26 * 1000 * (8 + 1) * 4
    assert (wide.table_bytes, wide.table_slot_bytes) == (wide_tables,
                                                         2 * wide_tables)
    assert (wide.dense_bytes, wide.dense_slot_bytes) == (40, 0)


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
@pytest.mark.parametrize("spec", [criteo(buckets=300, dim=4),
                                  movielens(dim=4)], ids=["criteo",
                                                          "movielens"])
def test_dense_weights_are_counted_without_building_the_tables(name, spec):
    from psrec.models.build import build_model
    from psrec.models.ranking.model import count_parameters
    real = count_parameters(build_model(spec, model_config(name)))["dense"]
    assert dense_parameter_count(spec, model_config(name)) == real
    proxy = proxy_spec(spec)
    assert all(t.rows <= len(spec.categorical) for t in proxy.tables)
    assert len(proxy.categorical) == len(spec.categorical)


def test_guard_fires_for_an_oversized_table_with_size_and_ps_advice():
    huge = criteo(buckets=20_000_000, dim=32)  # 26 x 20M x 32 floats
    size = estimate_replicated_bytes(huge, model_config("dcn"))
    assert size.table_bytes == 26 * 20_000_000 * 32 * 4  # nothing allocated
    with pytest.raises(ModelTooLargeError) as error:
        check_fits(size, SIXTEEN_GIB, memory_fraction=0.5)
    message = str(error.value)
    assert f"{size.total_bytes / GIB:.3f} GiB" in message
    assert "`StrategyConfig.memory_fraction` = 0.5" in message and "16.0 GiB of one GPU" \
        in message
    assert "Use --strategy ps" in message
    # The default spec fits easily.
    check_fits(estimate_replicated_bytes(criteo(), model_config("dcn")),
               SIXTEEN_GIB, memory_fraction=0.5)


def test_replicas_sharing_one_memory_count_once_each():
    size = SizeEstimate(3 << 30, 3 << 30, 0, 0)  # 6 GiB per replica
    check_fits(size, SIXTEEN_GIB, 0.5)  # 6 <= 8
    with pytest.raises(ModelTooLargeError, match="x 2 replicas sharing it"):
        check_fits(size, SIXTEEN_GIB, 0.5, replicas_sharing_memory=2)


def test_bad_arguments_name_the_argument_and_value():
    size = SizeEstimate(1, 1, 1, 1)
    with pytest.raises(ValueError, match=r"`memory_fraction` = 0.0"):
        check_fits(size, SIXTEEN_GIB, 0.0)
    with pytest.raises(ValueError, match=r"`memory_fraction` = 1.5"):
        check_fits(size, SIXTEEN_GIB, 1.5)
    with pytest.raises(ValueError, match=r"`replicas_sharing_memory` = 0"):
        check_fits(size, SIXTEEN_GIB, 0.5, replicas_sharing_memory=0)
    with pytest.raises(ValueError, match=r"`max_ids` = 0"):
        proxy_spec(criteo(buckets=10), 0)
    with pytest.raises(ValueError, match=r"`kind` = 'TPU'"):
        device_memory_bytes("TPU")


def test_device_memory_is_read_from_this_machine():
    memory = device_memory_bytes()
    assert memory.kind in ("GPU", "CPU")
    assert memory.bytes > 256 << 20
    assert memory.source


def test_proxy_spec_keeps_features_dense_and_widths():
    spec = movielens(dim=4)
    proxy = proxy_spec(spec, max_ids=10)
    assert [f.name for f in proxy.categorical] == [
        f.name for f in spec.categorical]
    assert [f.max_length for f in proxy.categorical] == [
        f.max_length for f in spec.categorical]
    assert proxy.dense == spec.dense
    assert {t.name: t.dim for t in proxy.tables} == {
        t.name: t.dim for t in spec.tables}
    user_attr = [f for f in proxy.categorical if f.table == "user_attr"]
    assert [f.row_offset for f in user_attr] == [0, 8, 18]
    assert proxy.table("user_attr").rows == 28
