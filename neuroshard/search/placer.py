"""The one greedy placer every algorithm shares (baselines, measured-greedy, the NeuroShard
grid search, bayes): pieces in order of falling key, each on the least-loaded device
(sum of keys) that has memory for it, optionally under a per-device width cap."""
from __future__ import annotations

import numpy as np


def greedy_place(keys: np.ndarray, sizes_bytes: np.ndarray, num_devices: int, memory_bytes: int,
                 widths: np.ndarray | None = None, caps: np.ndarray | None = None,
                 groups: np.ndarray | None = None, host_size: int | None = None,
                 allowed: np.ndarray | None = None, first: np.ndarray | None = None) -> np.ndarray:
    """For every width cap at once (``caps``; None: one run without a cap): pieces in order
    of falling ``keys``, each on the device with the lowest sum of keys that has memory for
    it and ``widths`` headroom under the cap (ignoring the cap when no device meets it).
    Pieces of one group (``groups``, the row blocks of one column strip,
    ``rowwise.strip_groups``; -1 for none) go to distinct devices where memory allows;
    with ``host_size`` (devices per host), a group of that many blocks stays on the host
    of its first block where memory allows (table-row-wise). ``allowed`` (pieces, devices),
    when given, says where each piece may go at all (pinned tables, ``constraints``); pieces
    marked ``first`` (of constrained tables) are placed before the others, the fewest
    allowed devices first (most constrained first).
    Returns (len(caps), pieces) devices; a row of -1 where memory runs out."""
    keys = np.asarray(keys, dtype=np.float64)
    permitted = allowed  # (the loop's ``allowed`` is per cap)
    sizes_bytes = np.asarray(sizes_bytes, dtype=np.float64)
    widths = np.zeros(len(keys)) if widths is None else np.asarray(widths, dtype=np.float64)
    caps = np.array([np.inf]) if caps is None else np.asarray(caps, dtype=np.float64)
    grid = len(caps)
    rows = np.arange(grid)
    state = np.zeros((3, grid, num_devices))  # per cap and device: load, memory left, width left
    state[1] = memory_bytes
    state[2] = caps[:, None]
    load, free, headroom = state
    change = np.stack([keys, -sizes_bytes, -widths], axis=1)  # what placing a piece adds
    devices = np.zeros((grid, len(keys)), dtype=np.int64)
    failed = np.zeros(grid, dtype=bool)
    groups = np.full(len(keys), -1, dtype=np.int64) if groups is None else np.asarray(groups)
    taken = np.zeros((grid, int(groups.max(initial=-1)) + 1, num_devices), dtype=bool)  # group already on device
    on_host = np.zeros(0, dtype=bool)  # per group: kept on one host
    if host_size is not None and host_size < num_devices:
        on_host = np.bincount(groups[groups >= 0], minlength=taken.shape[1]) == host_size
        host = np.arange(num_devices) // host_size
    order = np.argsort(-keys, kind="stable")
    if first is not None:  # constrained pieces first, the fewest devices allowed (pinned) first, by key within
        choices = permitted.sum(axis=1) if permitted is not None else np.zeros(len(keys))
        order = order[np.lexsort((choices[order], ~np.asarray(first, dtype=bool)[order]))]
    for s in order.tolist():
        fits = free >= sizes_bytes[s]
        if permitted is not None:
            fits &= permitted[s]
        if groups[s] >= 0:
            apart = fits & ~taken[:, groups[s]]
            if on_host.size and on_host[groups[s]]:  # the host of the group's first block, once placed
                started = taken[:, groups[s]].any(axis=1, keepdims=True)
                first_host = host[taken[:, groups[s]].argmax(axis=1)][:, None]
                same = apart & (~started | (host[None, :] == first_host))
                apart = np.where(same.any(axis=1, keepdims=True), same, apart)
            fits = np.where(apart.any(axis=1, keepdims=True), apart, fits)
        allowed = fits & (headroom >= widths[s])
        ok = allowed.any(axis=1)
        if not ok.all():  # no device under the cap: any device with memory
            allowed[~ok] = fits[~ok]
            failed |= ~fits.any(axis=1)
        chosen = np.where(allowed, load, np.inf).argmin(axis=1)
        devices[:, s] = chosen
        state[:, rows, chosen] += change[s][:, None]
        if groups[s] >= 0:
            taken[rows, groups[s], chosen] = True
    devices[failed] = -1
    return devices
