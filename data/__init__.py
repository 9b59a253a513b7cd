"""Data: ingest, Parquet->TFRecord conversion, manifests and input functions.

Importing this package does not import TensorFlow; the TensorFlow-backed
modules (``data.convert``, ``data.dataset``, ``data.records``,
``data.audit``) are imported where they are used.
"""

from data.ingest import IngestError
from data.ingest import IngestReport
from data.ingest import ingest_criteo
from data.ingest import ingest_movielens
from data.manifest import Manifest
from data.manifest import ManifestError
from data.synthetic import synthetic_table
from data.synthetic import write_synthetic_parquet

__all__ = [
    "IngestError",
    "IngestReport",
    "Manifest",
    "ManifestError",
    "ingest_criteo",
    "ingest_movielens",
    "synthetic_table",
    "write_synthetic_parquet",
]
