"""Counterfactual physics: the same model with one named cost removed.

A gain a configuration shows over its baseline is split into causes by running
both again with costs removed one after the other, in ``ORDER`` (cumulative:
step i removes the first i costs). The part of the gain a cost explains is how
much the gap between baseline and configuration shrinks when that cost is
removed; what is left once every cost is gone is the overlap proper. The parts
add up to the whole gain by construction (a telescoping sum); they depend on
the order, which is fixed and stated (``ORDER``). The last cause,
``dram-traffic``, is not a counterfactual run: it credits only the DRAM bytes
that differ between the two runs (``split``), so DRAM time a configuration merely
overlaps stays with the overlap.

Each counterfactual is a change of the *device the clock runs on*, never of the
plan: configurations are built from the real device (a heuristic or a tuner
picks as it would), then timed on the ablated one, so any configuration,
plugins included, gets the same counterfactuals. What each removes:

- ``launches``: every kernel launch is free (``DeviceSpec.launch_s`` = 0): the
  launch of every phase and of every further launch of a multi-launch kernel.
- ``library-latency``: the collective library's own latency is free
  (``InterconnectSpec.library_latency`` = False): its base latency per call (beyond
  the launch) and its protocol's per-step latency beyond the link's own (a step then
  arrives the route's latency after it left, as every other executor's does). What a
  fused kernel does not pay.
- ``dma-setup``: a DMA command's set-up (``DeviceSpec.dma_setup_s``: fetch, decode,
  schedule; queued commands already hide it under the running transfer) costs nothing,
  for copy engines, DMA pushes and pulls, local copies and flag writes alike.
- ``gemm-efficiency``: the GEMM kernel model's costs are gone (``[gemm] enabled`` =
  false on the clock's device): a stage of a modelled kernel takes its useful FLOPs at
  the matrix peak, with no tile or wave quantisation, main-loop efficiency, latency, L2
  bound or split-K workspace (its tiles stay the ones the heuristic chose). GEMMs of
  the device's fixed tile (no ``[gemm]`` section) run at the matrix peak
  (``matrix_efficiency`` = 1).
- ``executor-parity``: every executor at the library's link efficiency: the GPU's own
  stores and copy engines at ``library_fraction``, NIC puts at the network's
  ``library_fraction``, so what is left of a gain is not an executor moving bytes more
  efficiently than the library does (a device whose executors already match its
  library's fractions, T3's simulator, is unchanged).
- ``link-efficiency``: every executor achieves the link's (and NIC's) peak:
  library collectives' ``library_fraction`` (and ``[network]
  library_fraction``) = 1, and the ``[executors]`` fractions of the GPU's own
  stores, copy engines and NIC puts = 1 (the library protocols' shares from its
  tuning model stay). What remains of link time is bytes over peak bandwidth.
- ``ingress``: a receiver's ports take every writer at once
  (``InterconnectSpec.ingress_queue`` = False): its down port behind a switch (or
  PCIe) and, across a fabric, its NIC's receive side. Writers arriving together
  no longer queue one after another there (``RankClock.receive``), as if each had
  a port of its own into the destination. The senders' own ports still limit
  each. Systems without such a port (rings and full meshes within a node, a
  torus) are unchanged.
- ``contention``: communication has a DRAM of its own (``DramSpec.shared`` =
  False): DMA, copy-engine and NIC reads, data landing from peers and
  CU-driven collective traffic are served beside the compute stream instead of
  sharing its queues, with no arbitration ceiling, no blocking and no read/write
  turnaround. Each stream still pays its own bytes at the HBM's rate.
- ``dram-traffic``: the DRAM bytes one run moves and the other does not, at the HBM's
  rate: (baseline's rank-mean DRAM bytes - configuration's) / ``hbm_bw`` (its
  sustained rate), taken from the two runs as they ran; the gap left beyond it is
  the overlap. ``--ablate dram-traffic`` (a what-if, not a cause) makes DRAM bytes cost
  nothing: the HBM's bandwidth multiplied by ``FREE_DRAM`` (traffic, near-memory update
  costs and row misses vanish; the loaded latency of latency-bound kernels stays).
"""

from __future__ import annotations

import dataclasses

from emulator.model.topology import has_receive_queue

ORDER = ("launches", "library-latency", "dma-setup", "gemm-efficiency", "executor-parity",
         "link-efficiency", "ingress", "contention", "dram-traffic")
RUNS = ORDER[:-1]  # the causes found by counterfactual runs (dram-traffic: from bytes)
HELP = {
    "launches": "kernel launches cost nothing",
    "library-latency": "the collective library's base and per-step protocol latency cost "
                       "nothing (the link's own latency stays)",
    "dma-setup": "DMA commands' set-up costs nothing",
    "gemm-efficiency": "GEMM stages at the matrix peak on their useful FLOPs (no tile or wave "
                       "quantisation, main-loop efficiency, latency or split-K workspace)",
    "executor-parity": "every executor at the library's link efficiency (store, copy and "
                       "put fractions = the library's)",
    "link-efficiency": "every executor at the link's peak (library, store, copy and put "
                       "fractions 1)",
    "ingress": "a receiver's down port and NIC take every writer at once (no queue "
               "behind other writers)",
    "contention": "communication's DRAM traffic served beside compute's, not sharing its "
                  "queues",
    "dram-traffic": "the DRAM bytes that differ between the runs, at the HBM's rate (with "
                    "--ablate: DRAM bytes cost nothing, HBM bandwidth x 1e6)",
}
FREE_DRAM = 1e6  # HBM bandwidth multiplier of ``--ablate dram-traffic``: 1e-6 of real


class AblationError(ValueError):
    """An unknown cost name."""


def check(names: tuple[str, ...]) -> tuple[str, ...]:
    """``names`` in ``ORDER``'s order; raises AblationError for an unknown or repeated one."""
    bad = [n for n in names if n not in ORDER]
    if bad or len(set(names)) != len(names):
        raise AblationError(f"{','.join(names)}: allowed: {', '.join(ORDER)} (comma-separated, "
                            f"each once)")
    return tuple(n for n in ORDER if n in names)


def steps() -> list[tuple[str, ...]]:
    """The cumulative counterfactuals of the causes split: (launches,), (launches,
    library-latency), ... every cost found by a run (``RUNS``)."""
    return [RUNS[: i + 1] for i in range(len(RUNS))]


def ablate(spec, names: tuple[str, ...]):
    """``spec`` (a ``DeviceSpec``) with the costs ``names`` removed."""
    names = check(tuple(names))
    if "launches" in names:
        spec = dataclasses.replace(spec, launch_s=0.0)
    if "library-latency" in names and spec.interconnect.library:
        spec = dataclasses.replace(spec, interconnect=dataclasses.replace(
            spec.interconnect, library_latency=False))
    if "dma-setup" in names:
        spec = dataclasses.replace(spec, dma_setup_s=0.0)
    if "gemm-efficiency" in names and spec.gemm is not None:
        spec = dataclasses.replace(spec, gemm=dataclasses.replace(spec.gemm, enabled=False))
    if "gemm-efficiency" in names and spec.matrix_efficiency != 1.0:
        spec = dataclasses.replace(spec, matrix_efficiency=1.0)
    if "executor-parity" in names and "link-efficiency" not in names:
        ic = spec.interconnect
        ex = dataclasses.replace(spec.executors, store_fraction=ic.library_fraction,
                                 copy_fraction=ic.library_fraction,
                                 put_fraction=ic.library_fraction_network)
        if ex != spec.executors:
            spec = dataclasses.replace(spec, executors=ex)
    if "link-efficiency" in names:
        spec = dataclasses.replace(spec, interconnect=dataclasses.replace(
            spec.interconnect, library_fraction=1.0, library_fraction_network=1.0),
            executors=dataclasses.replace(spec.executors, store_fraction=1.0,
                                          copy_fraction=1.0, put_fraction=1.0))
    if "ingress" in names and has_receive_queue(spec.interconnect):
        spec = dataclasses.replace(spec, interconnect=dataclasses.replace(
            spec.interconnect, ingress_queue=False))
    if "contention" in names:
        spec = dataclasses.replace(spec, dram=dataclasses.replace(spec.dram, shared=False))
    if "dram-traffic" in names:
        spec = dataclasses.replace(spec, hbm_bw=spec.hbm_bw * FREE_DRAM,
                                   dram=dataclasses.replace(
                                       spec.dram, channels=spec.dram.channels_for(spec.hbm_bw)))
    return spec


def split(baseline: list[float], config: list[float], dram_s: float = 0.0
          ) -> dict[str, float]:
    """The causes of ``config``'s gain over ``baseline`` from their modelled times under
    no ablation and each of ``steps()`` (len(RUNS) + 1 times each) and ``dram_s``, the
    DRAM time of the bytes the baseline moves beyond the configuration's (negative: it
    moves fewer): cause -> seconds of the gain it explains, ``dram-traffic`` = ``dram_s``,
    and ``overlap``, the gap left with every cost removed less ``dram_s``."""
    if len(baseline) != len(RUNS) + 1 or len(config) != len(RUNS) + 1:
        raise ValueError(f"need {len(RUNS) + 1} times each (none removed, then each step)")
    gaps = [b - c for b, c in zip(baseline, config)]
    parts = {name: gaps[i] - gaps[i + 1] for i, name in enumerate(RUNS)}
    parts["dram-traffic"] = dram_s
    parts["overlap"] = gaps[-1] - dram_s
    return parts
