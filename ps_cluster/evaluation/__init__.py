"""Streaming evaluation metrics that merge across closures (counts, logloss,
AUC, calibration): the results every strategy's evaluation reports; and
the ROC, precision-recall and calibration curves of ``psrec eval --plots``.
"""
