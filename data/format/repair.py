"""Record-level TFRecord scanning, for a bounded, counted skip of corrupted
records (``psrec train --max-corrupt-records N``).

tf.data's ``ignore_errors`` drops the whole rest of a file after the first
bad record, silently. Here each record's framing is read and its masked
CRC32C checked in Python, so exactly the corrupted records are counted and
left out of a repaired copy of the shard; everything else is kept.

TFRecord framing: ``uint64 length | uint32 masked_crc(length) | data |
uint32 masked_crc(data)``, little-endian.
"""

from __future__ import annotations

import dataclasses
import struct
from pathlib import Path

from psrec.data.format.files import atomic_output
from psrec.uri_path import as_path

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_MASK_DELTA = 0xA282EAD8


def _table() -> list[int]:
    table = []
    for i in range(256):
        crc = i
        for _ in range(8):
            crc = (crc >> 1) ^ _POLY if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in data:
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class ScanResult:
    """What a record-level scan of one file found.

    Attributes:
      good: records whose CRCs match.
      corrupted: records whose data CRC fails (each skipped exactly).
      unreadable_from: byte offset from which the framing itself is broken
        (a bad length CRC or truncation); None when the whole file framed.
    """

    path: str
    good: int
    corrupted: int
    unreadable_from: int | None

    @property
    def clean(self) -> bool:
        return self.corrupted == 0 and self.unreadable_from is None


def scan_records(path: str | Path, repaired: str | Path | None = None
                 ) -> ScanResult:
    """Checks every record of ``path`` (an uncompressed TFRecord file); with
    ``repaired``, writes the good ones there (framed as TFRecords, under a
    temporary name and renamed)."""
    data = as_path(path).read_bytes()
    out = bytearray()
    good = corrupted = 0
    offset, unreadable = 0, None
    while offset < len(data):
        header = data[offset:offset + 12]
        if len(header) < 12:
            unreadable = offset
            break
        (length,) = struct.unpack("<Q", header[:8])
        (length_crc,) = struct.unpack("<I", header[8:12])
        end = offset + 12 + length + 4
        if masked_crc(header[:8]) != length_crc or end > len(data):
            unreadable = offset
            break
        record = data[offset + 12:offset + 12 + length]
        (data_crc,) = struct.unpack("<I", data[end - 4:end])
        if masked_crc(record) == data_crc:
            good += 1
            out += data[offset:end]
        else:
            corrupted += 1
        offset = end
    if repaired is not None:
        with atomic_output(repaired) as tmp:
            tmp.write_bytes(bytes(out))
    return ScanResult(str(path), good, corrupted, unreadable)
