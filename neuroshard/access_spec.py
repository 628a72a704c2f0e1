"""What the tables format says about an ``access`` object, below every pipeline stage.

``tables.py`` validates access objects with these constants; ``datasets.access``
samples lookups from them.
"""
from __future__ import annotations

#: bins of a reuse histogram: a row looked up ``c`` times in a batch falls in bin ``ceil(log2(c))``
NUM_BINS = 17
#: how popularity ranks map to row ids (``access.row_order``)
ROW_ORDERS = ("scattered", "hottest_first")
