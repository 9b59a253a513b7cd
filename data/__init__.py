"""Data: ingest, Parquet->TFRecord conversion, manifests and input functions.

Importing this package does not import TensorFlow; the TensorFlow-backed
modules (``data.convert``, ``data.dataset``, ``data.records``,
``data.audit``) are imported where they are used.
"""

from psrec.data.criteo import ingest_criteo
from psrec.data.ingest import IngestError
from psrec.data.ingest import IngestReport
from psrec.data.manifest import Manifest
from psrec.data.manifest import ManifestError
from psrec.data.movielens import ingest_movielens
from psrec.data.synthetic import synthetic_table
from psrec.data.synthetic import write_synthetic_parquet

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
