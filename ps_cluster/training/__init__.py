"""Training: the one trainer and train step for every strategy, how steps are
executed, streaming metrics, per-epoch coverage, the stall watchdog, the
dynamic tables' maintenance and the tf.data service.
"""
