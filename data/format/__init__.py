"""The on-disk format of converted data: the record format, the manifest
(commit marker and table of contents), atomic file writes and record-level
repair scans.
"""
