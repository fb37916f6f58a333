"""Chrome/Perfetto trace of a run, in modelled time.

One process per emulated GPU (rank) and configuration; inside it one track
(thread) per resource the modelled clock logged on: the GEMM stages, the DMA
engine, each outgoing link (or switch port), HBM landing of received data,
the CU-driven collective kernels (rs, ag, a2a) and the tracker, whose
triggers (a region reaching its threshold) are instant events; and two counter
tracks from the memory controller (``emulator/model/dram.py``): HBM bandwidth
by stream (GEMM reads and writes, DMA reads, landing stores and updates, CU
kernels) and the communication backlog in the DRAM queue, per microsecond. Timestamps are
microseconds of modelled time (the trace-event format's unit), so the
Perfetto UI (https://ui.perfetto.dev) shows the emulated hardware's timeline,
not the host's. Format: the Trace Event Format's JSON object form
(``traceEvents`` with ``X`` complete events, ``i`` instants and ``M`` metadata).
"""

from __future__ import annotations

# track order inside a rank's process; links and anything else come after
_TRACKS = ("gemm", "displaced", "dma", "tracker", "hbm", "rs", "ag", "a2a")
_LABELS = {"gemm": "GEMM stages", "displaced": "GEMM: HBM bytes communication displaced "
           "(served before its next stage)", "dma": "DMA engine", "tracker": "tracker triggers",
           "hbm": "HBM (received data lands)", "rs": "RS kernel (CUs)",
           "ag": "AG kernel (CUs)", "a2a": "A2A kernel (CUs)"}


def _wg(track: str) -> int | None:
    """A persistent kernel's physical WG of a ``wg<j>`` track (its own timeline)."""
    return int(track[2:]) if track.startswith("wg") and track[2:].isdigit() else None


def _track_key(track: str) -> tuple[int, int, str]:
    if track in _TRACKS:
        return (_TRACKS.index(track), 0, track)
    wg = _wg(track)  # the WG timeline right after the GEMM's track, in WG order
    return (0, 1 + wg, track) if wg is not None else (len(_TRACKS), 0, track)


def _label(track: str) -> str:
    if track.startswith("link->"):
        return f"link to rank {track[6:]} (occupancy)"
    wg = _wg(track)
    if wg is not None:
        return f"WG {wg} (persistent kernel)"
    return _LABELS.get(track, track)


def _plain(value):
    """JSON-safe scalars (numpy ints and floats from the cost model)."""
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def chrome_trace(runs: list[tuple[str, list[list[tuple]]]], doc: dict) -> dict:
    """``runs``: (mode, events per rank) with events (track, name, start_s, end_s, args)."""
    out: list[dict] = []
    pid = 0
    for mode_index, (mode, per_rank) in enumerate(runs):
        for rank, events in enumerate(per_rank):
            pid += 1
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                        "args": {"name": f"rank {rank} · {mode}"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0,
                        "args": {"sort_index": mode_index * 100000 + rank}})
            for track, name, start, end, args in events:  # counter tracks (the DRAM's)
                if track.startswith("counter:"):
                    out.append({"ph": "C", "name": track[8:], "pid": pid, "ts": start * 1e6,
                                "args": {k: _plain(v) for k, v in args.items()}})
            events = [ev for ev in events if not ev[0].startswith("counter:")]
            tracks = sorted({ev[0] for ev in events}, key=_track_key)
            tids = {track: i + 1 for i, track in enumerate(tracks)}
            for track, tid in tids.items():
                out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                            "args": {"name": _label(track)}})
                out.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                            "args": {"sort_index": tid}})
            for track, name, start, end, args in sorted(events, key=lambda e: (e[2], e[3])):
                ev = {"name": name, "cat": track, "pid": pid, "tid": tids[track],
                      "ts": start * 1e6, "args": {k: _plain(v) for k, v in args.items()}}
                if end > start:
                    ev.update(ph="X", dur=(end - start) * 1e6)
                else:
                    ev.update(ph="i", s="t")
                out.append(ev)
    cfg = doc["config"]
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"tool": "t3emu", "time": "modelled (us)",
                          "collective": cfg["collective"], "algorithm": cfg["algorithm"],
                          "topology": cfg["topology"], "ranks": doc["world_size"],
                          "shape": f"M={cfg['m']} N={cfg['n']} K={cfg['k']} {cfg['dtype']}",
                          "device": doc["device"]["name"]}}
