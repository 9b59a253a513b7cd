"""Streaming evaluation metrics that merge across closures (counts, logloss,
AUC, calibration): the results every strategy's evaluation reports.
"""
