"""Data: ``format`` (records, manifests), ``ingest`` (raw logs -> Parquet),
``convert`` (Parquet -> TFRecords), ``infer`` (``psrec spec infer``) and
``input`` (input functions, audit, integrity checks).

Importing this package does not import TensorFlow; the TensorFlow-backed
modules are imported where they are used.
"""

from psrec.data.format.manifest import Manifest
from psrec.data.format.manifest import ManifestError
from psrec.data.ingest.common import IngestError
from psrec.data.ingest.common import IngestReport
from psrec.data.ingest.criteo import ingest_criteo
from psrec.data.ingest.movielens import ingest_movielens
from psrec.data.ingest.synthetic import synthetic_table
from psrec.data.ingest.synthetic import write_synthetic_parquet

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
