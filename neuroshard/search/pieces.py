"""The pieces a simulator has seen, by small integer id, with the features the compute
model is fed.

Search evaluates thousands of candidates over the same few hundred pieces, so each piece
gets an id once (``ids_of``) and its features are computed once. Pieces of equal features
(a table's two equal column halves) share a feature class (``classes``): the compute model
sees them as one.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..constants import FP32_BYTES
from ..costmodels.base import CostModels
from ..costmodels.features import FEATURE_NAMES, table_features
from ..datasets.sampler import shard_table
from ..tables import TableSet
from ..types import Piece

_DIM = FEATURE_NAMES.index("dim")
_LOG_SIZE = FEATURE_NAMES.index("log2_size_bytes")


class PieceIndex:
    """Pieces of ``tables`` by id: ``pieces[i]`` and ``features[i]`` (``FEATURE_NAMES``, at
    the cost models' batch size) of piece ``i``. Shared by every copy of a simulator."""

    def __init__(self, tables: TableSet, cost_models: CostModels):
        self.tables = tables
        self.cost_models = cost_models
        self.ids: dict[Piece, int] = {}
        self.pieces: list[Piece] = []
        self.features: list[np.ndarray] = []
        self._row_features: dict[tuple[int, int, int], np.ndarray] = {}
        # pieces of equal features are one to the model (``Performance.set_costs_ms``)
        self._class_of: dict[bytes, int] = {}     # a piece's features -> their number
        self.class_rows: list[np.ndarray] = []    # the features of each number
        self._classes = np.zeros(0, dtype=np.int64)  # per piece id, its number

    def __len__(self) -> int:
        return len(self.pieces)

    def ids_of(self, pieces: Sequence[Piece]) -> np.ndarray:
        """Stable small integers for ``pieces`` (new pieces get their features computed once)."""
        ids = self.ids
        for piece in pieces:
            if piece not in ids:
                ids[piece] = len(self.pieces)
                self.pieces.append(piece)
                self.features.append(self._piece_features(piece))
        return np.array([ids[p] for p in pieces], dtype=np.int64)

    def _piece_features(self, piece: Piece) -> np.ndarray:
        """Features of a piece. Rows decide lookups and reuse (``sampler.shard_table``, cached per
        row range); a column range only changes the width and the size."""
        table = self.tables[piece.table]
        key = (piece.table, piece.row_offset, piece.num_rows)
        base = self._row_features.get(key)
        if base is None:
            part = shard_table(table, piece.row_offset, piece.num_rows, 0, table.embedding_dim,
                               self.cost_models.batch_size)
            base = table_features(part, self.cost_models.batch_size)
            self._row_features[key] = base
        features = base.copy()
        features[_DIM] = piece.num_cols
        features[_LOG_SIZE] = np.log2(piece.num_rows * piece.num_cols * FP32_BYTES)
        return features

    def features_array(self) -> np.ndarray:
        """(pieces, NUM_FEATURES) features of every piece, by id."""
        return np.stack(self.features) if self.features else np.zeros((0, len(FEATURE_NAMES)), dtype=np.float32)

    def classes(self) -> np.ndarray:
        """Per piece id, the number of its features (pieces of equal features share it;
        ``class_rows[number]`` are the features)."""
        done = len(self._classes)
        if done < len(self.features):
            index = self._class_of
            new = []
            for row in self.features[done:]:
                number = index.setdefault(row.tobytes(), len(index))
                if number == len(self.class_rows):
                    self.class_rows.append(row)
                new.append(number)
            self._classes = np.concatenate([self._classes, np.array(new, dtype=np.int64)])
        return self._classes
