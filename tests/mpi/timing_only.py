"""Numeric and timing-only runs of every supported combination give the same model.

For each (collective, algorithm, topology) the real worker runs every mode twice,
once moving data and once without payloads; rank 0 compares the two JSON
documents: modelled times, phase windows on every rank, DRAM bytes by rank and
category, and the arbitration choice must be identical (not approximately). The numeric
runs are the whole-registry numerics matrix at these rank counts (every mode must PASS
against the reference): a combination that splits K on the full mesh (split 2 above) also
runs numerically unsplit, as ``matrix.py`` does on the other rank counts.
"""

import json
import sys
from pathlib import Path

from mpi4py import MPI

from tests.ops import COLLECTIVES, TOPOLOGIES, matrix_shape, splits, supported
from emulator.app.config import RunConfig
from emulator.app.worker import _main

SAME = ("modelled_time_s", "phases", "phase_windows_s", "rank_phases_s", "rank_end_s",
        "dram_bytes", "dram_bytes_per_rank", "arbitration")


def _run(collective: str, algorithm: str, topology: str, dtype: str, split: int,
         timing_only: bool, path: Path) -> bool:
    """One combination's every mode through the real worker; True where it exited 0."""
    cfg = RunConfig(ranks=MPI.COMM_WORLD.size, collective=collective, topology=topology,
                    algorithm=algorithm, dtype=dtype, split_k=split, watchdog_s=60,
                    json=str(path), timing_only=timing_only,
                    **matrix_shape(collective)).validate()
    return _main(cfg) == 0


def main(out: Path) -> int:
    comm = MPI.COMM_WORLD
    checked = unsplit = 0
    i = 0
    for collective in COLLECTIVES:
        for topology in TOPOLOGIES:
            for algorithm in ("ring", "direct"):
                if not supported(collective, algorithm, topology):
                    continue
                i += 1
                combo = (collective, algorithm, topology, "fp32" if i % 2 else "fp16")
                split = topology == "full-mesh" and splits(collective)
                docs = []
                for timing_only in (False, True):
                    path = out / f"{collective}-{algorithm}-{topology}-{int(timing_only)}.json"
                    if not _run(*combo, 2 if split else 1, timing_only, path):
                        print(f"TIMING FAIL run {collective} {algorithm} {topology}", flush=True)
                        return 1
                    docs.append(path)
                if comm.rank == 0:
                    numeric, timing = (json.loads(p.read_text()) for p in docs)
                    for a, b in zip(numeric["runs"], timing["runs"], strict=True):
                        assert a["numerics"] == "pass" and b["numerics"] == "timing-only"
                        for key in SAME:
                            if a[key] != b[key]:
                                print(f"TIMING DIFFER {collective} {algorithm} {topology} "
                                      f"{a['mode']} {key}: {a[key]} != {b[key]}", flush=True)
                                return 1
                        checked += 1
                if split:  # the same combination unsplit, numeric
                    path = out / f"{collective}-{algorithm}-{topology}-split1.json"
                    if not _run(*combo, 1, False, path):
                        print(f"NUMERIC FAIL {collective} {algorithm} {topology} split 1",
                              flush=True)
                        return 1
                    if comm.rank == 0:
                        runs = json.loads(path.read_text())["runs"]
                        assert all(r["numerics"] == "pass" for r in runs), path
                        unsplit += len(runs)
    if comm.rank == 0:
        print(f"TIMING SAME {checked} runs on {comm.size} ranks", flush=True)
        print(f"UNSPLIT PASS {unsplit} runs on {comm.size} ranks", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
