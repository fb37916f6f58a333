"""Flux's configurations (collectives/flux*.py). Their numerics on 2, 3, 4 and 8 ranks,
fp16 and fp32, split-K 1 and 2, uneven shapes, on every topology are in the whole matrix
(tests/test_collectives.py), and timing-only against numeric in tests/test_timing_only.py:
both run every configuration of every operation and algorithm. The forms that need a
platform (two sockets, two nodes) are checked here on systems of 2, 4 and 8 GPUs, and on
16 across two emulated hosts."""

import json

import pytest

from tests.conftest import ROOT, run_cli, run_pooled
from tests.ops import modes_for

FLUX = ("flux-rs-w", "flux-rs-a", "flux-rs-w-noswizzle", "flux-rs-a-noswizzle")
HOPPER = ("flux-rs-pull",)  # sm90 only
FLUX_RING = ("flux-rs-ring", "flux-rs-ring2d")
FLUX_AG = ("flux-ag", "flux-ag-tile2", "flux-ag-tile4", "flux-ag-tile8", "flux-ag-pull",
           "flux-ag-pull-tile2", "flux-ag-pull-tile4", "flux-ag-pull-tile8", "flux-ag-noswizzle")
FLUX_AG_RING = ("flux-ag-ring", "flux-ag-ring2d")
SMALL = ["--m", "517", "--n", "300", "--k", "129"]
SAME = ("modelled_time_s", "phases", "rank_phases_s", "dram_bytes_per_rank")


def test_flux_configurations_run_on_their_algorithms():
    """Direct forms on a switch or mesh, ring forms (PCIe) on a ring algorithm; GEMM + RS
    and AG + GEMM only."""
    assert set(FLUX) | set(HOPPER) | {"flux-best", "te-best"} <= set(modes_for("rs", "direct"))
    assert not set(HOPPER) & set(modes_for("rs", "ring"))
    assert set(FLUX_RING) | {"flux-best", "te-best"} <= set(modes_for("rs", "ring"))
    assert not set(FLUX) & set(modes_for("rs", "ring"))
    assert not set(FLUX_RING) & set(modes_for("rs", "direct"))
    assert not (set(FLUX) | set(FLUX_RING)) & set(modes_for("ar", "direct"))
    assert set(FLUX_AG) <= set(modes_for("ag-gemm", "direct"))
    assert set(FLUX_AG_RING) <= set(modes_for("ag-gemm", "ring"))
    assert not set(FLUX_AG) & set(modes_for("ag-gemm", "ring"))
    proc = run_pooled(["run", "-n", "2", "--collective", "rs", "--topology", "ring", "--mode",
                       "flux-rs-w"], timeout=60)
    assert proc.returncode == 2
    assert "it runs --algorithm direct" in proc.stderr


def _system(tmp_path, kind: str, per: int) -> str:
    """A system file: one PCIe node of two sockets of ``per`` A100s (``pcie2``: two such
    nodes, a NIC per socket), or two NVSwitch nodes of ``per`` H800s (the shapes of Flux's
    platforms at 2, 4 and 8 GPUs; sm90, so that the Hopper RS variant runs too)."""
    path = tmp_path / f"{kind}-{per}.toml"
    if kind.startswith("pcie"):
        nodes = 2 if kind == "pcie2" else 1
        path.write_text(f"""name = "{kind}-{per}"\ndescription = "test"\ngpu = "a100-pcie"\n"""
                        f"""nodes = {nodes}\ngpus_per_node = {2 * per}\n[intra]\n"""
                        f"""topology = "pcie"\nsockets = 2\nsocket_gb_per_s_per_direction = 32\n"""
                        f"""socket_latency_ns = 500\n""" + (
                            """[network]\nkind = "fabric"\nnics_per_node = 2\n"""
                            """nic_gb_per_s_per_direction = 12.5\nlatency_ns = 3000\n"""
                            if nodes > 1 else ""))
    else:
        path.write_text(f"""name = "nodes-{per}"\ndescription = "test"\ngpu = "h800"\nnodes = 2\n"""
                        f"""gpus_per_node = {per}\n[intra]\ntopology = "switch"\n"""
                        f"""[network]\nkind = "fabric"\nnics_per_node = 1\n"""
                        f"""nic_gb_per_s_per_direction = 25\nlatency_ns = 3000\n""")
    return str(path)


@pytest.mark.parametrize("kind,per", [("pcie", 1), ("pcie", 2), ("pcie", 4), ("pcie2", 1),
                                      ("pcie2", 2), ("nodes", 1), ("nodes", 2), ("nodes", 4)])
@pytest.mark.parametrize("collective", ["rs", "ag-gemm"])
def test_flux_platform_forms_pass_numerics_and_time_alike(tmp_path, emulate, kind, per,
                                                         collective):
    """Two sockets (the 2D rings), two nodes (Flux's two-node forms) and two PCIe nodes of
    two sockets (the 2D rings across nodes) on 2, 4 and 8 GPUs:
    every configuration passes numerics (fp32, split-K 2 for the RS) against numpy + MPI,
    and timing-only gives the same modelled times."""
    args = ["--system", _system(tmp_path, kind, per), "--collective", collective, "--mode",
            "all", *SMALL, "--dtype", "fp32"] + (["--split-k", "2"] if collective == "rs"
                                                  else [])
    numeric = emulate(args)
    modes = {r["mode"] for r in numeric["runs"]}
    want = (FLUX_RING if collective == "rs" else FLUX_AG_RING) if kind.startswith("pcie") else (
        FLUX + HOPPER if collective == "rs" else FLUX_AG)
    # TransformerEngine runs within one node only (refused across nodes: left out of all)
    te = {"te-best"} if kind == "pcie" else set()
    assert set(want) | {"flux-best", "sequential"} | te <= modes
    assert kind == "pcie" or not any(m.startswith("te-") for m in modes)
    assert {r["numerics"] for r in numeric["runs"]} == {"pass"}
    timing = emulate(args + ["--timing-only"])
    for a, b in zip(numeric["runs"], timing["runs"], strict=True):
        for key in SAME:
            assert a[key] == b[key], (a["mode"], key)


@pytest.mark.parametrize("system,collective,modes", [
    ("a100-sxm-2x8", "rs", "sequential,flux-rs-a,flux-rs-w"),
    ("a100-sxm-2x8", "ag-gemm", "sequential,flux-ag,flux-ag-pull,flux-ag-tile2"),
    ("a100-pcie-2x8", "rs", "flux-rs-ring2d"), ("a100-pcie-2x8", "ag-gemm", "flux-ag-ring2d")])
def test_two_node_forms_on_sixteen_ranks_across_two_emulated_hosts(tmp_path, system, collective,
                                                                   modes):
    """TP 16 as Flux runs it (a100-sxm-2x8; two PCIe nodes: the 2D forms across nodes), the
    nodes as MPI's nodes: numerics pass and the modelled times are those of one host."""
    args = ["--system", system, "--collective", collective, "--mode", modes, *SMALL,
            "--dtype", "fp16"]
    docs = []
    for where in ([], ["--hosts", "n0,n1", "--same-machine"]):
        out = tmp_path / f"{len(where)}.json"
        proc = run_pooled(["run", *args, *where, "--json", str(out)], timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        docs.append(json.loads(out.read_text()))
    for a, b in zip(docs[0]["runs"], docs[1]["runs"], strict=True):
        assert a["numerics"] == b["numerics"] == "pass", a["mode"]
        for key in SAME:
            assert a[key] == b[key], (a["mode"], key)


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_the_hopper_rs_variant_passes_numerics_and_times_alike_on_an_h800_switch(emulate, ranks):
    """Flux's Hopper RS (local stores with flags, fetch and reduce warps) on 2, 3, 4 and 8
    H800s: numerics against numpy + MPI in fp32, fp16 and bf16 (split-K 2), timing-only
    equal to numeric."""
    from tests.ops import check_numerics_and_timing_only

    base = ["--device", "h800", "-n", str(ranks), "--topology", "switch", "--collective",
            "rs", "--algorithm", "direct", "--mode", "flux-rs-pull", *SMALL]
    check_numerics_and_timing_only(emulate, base)
    doc = emulate(base + ["--dtype", "bf16", "--values", "normal", "--split-k", "2"])
    assert doc["runs"][0]["numerics"] == "pass"


def test_the_hopper_rs_variant_is_refused_off_hopper():
    proc = run_pooled(["run", "--device", "a100-sxm", "-n", "2", "--topology", "switch",
                       "--collective", "rs", "--mode", "flux-rs-pull"], timeout=60)
    assert proc.returncode == 2
    assert "Hopper RS variant is an sm90 kernel" in proc.stderr and "a100-sxm is sm80" in \
        proc.stderr


def test_two_d_rings_win_when_the_cpu_link_is_the_bottleneck(tmp_path, emulate):
    """On a node of two sockets whose CPU link is slower than a GPU's PCIe port, the 2D forms
    (each sum or chunk crosses once: 1/2 of the data per direction) beat the 1D ring
    ((N-1)/N crosses, on the two ring hops between the sockets)."""
    path = tmp_path / "slow.toml"
    path.write_text(open(_system(tmp_path, "pcie", 4)).read().replace(
        "socket_gb_per_s_per_direction = 32", "socket_gb_per_s_per_direction = 4"))
    for collective, one, two in (("rs", "flux-rs-ring", "flux-rs-ring2d"),
                                 ("ag-gemm", "flux-ag-ring", "flux-ag-ring2d")):
        doc = emulate(["--system", str(path), "--collective", collective, "--m", "4096",
                       "--n", "2048", "--k", "1024", "--timing-only", "--mode",
                       f"sequential,{one},{two}"])
        t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
        assert t[two] < 0.8 * t[one], (collective, t)


def test_two_d_rings_across_pcie_nodes_finish_and_beat_the_1d_ring(tmp_path, emulate):
    """Two PCIe nodes of two sockets (8 GPUs), a GEMM of many stages: the 2D forms across
    nodes (inter-NUMA first, then intra-NUMA together with the NIC puts) finish (the RS's
    final sum once waited in the kernel ahead of the rank's own NIC puts in program order:
    a deadlock) and beat the 1D ring, which runs through both nodes. (RS by 10% since a
    transfer's ports are booked together: the 2D form's NIC puts share each GPU's PCIe
    port with its intra-node sends and need both free at once; by 23% before.)"""
    system = _system(tmp_path, "pcie2", 2)
    for collective, one, two in (("rs", "flux-rs-ring", "flux-rs-ring2d"),
                                 ("ag-gemm", "flux-ag-ring", "flux-ag-ring2d")):
        doc = emulate(["--system", system, "--collective", collective, "--m", "8192",
                       "--n", "4096", "--k", "64", "--timing-only", "--mode", f"{one},{two}"])
        t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
        assert t[two] < 0.95 * t[one], (collective, t)


def test_ring2d_all_gather_queues_its_chunks_in_arrival_order(emulate):
    """Llama-2 70B's FC-1 at decode batch 512 on the A100 PCIe node (M = 512: 64 rows per
    rank, under the GEMM tile's 128): a stage gates on several chunks, and with the copy
    engine's entries in chunk order rank 1 queued the sink of chunk 0 (the last to reach
    it) ahead of what its peers waited for: every engine stalled (the watchdog). In
    arrival order it finishes; the flux-paper PCIe points moved with it (m = 64: 319.2
    us before, 179.3 now, at N = 6144, K = 12288)."""
    doc = emulate(["--system", "a100-pcie-x8", "--collective", "ag-gemm", "--m", "512",
                   "--n", "7168", "--k", "8192", "--dtype", "bf16", "--timing-only",
                   "--mode", "flux-ag-ring2d"], timeout=120)
    assert doc["runs"][0]["modelled_time_s"] > 0


def test_flux_on_gpt3_rs_shape_swizzle_helps_and_rs_w_pays_its_reduction(emulate):
    """GPT-3 175B's GEMM-RS at TP 8 (m = 8192: 8192 x 12288 over k = 6144) on 8 A100s
    behind NVSwitch, timing-only."""
    doc = emulate(["-n", "8", "--device", "a100-sxm", "--collective", "rs", "--topology",
                   "switch", "--m", "8192", "--n", "12288", "--k", "6144", "--timing-only",
                   "--mode", "sequential,te-best," + ",".join(FLUX)])
    t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    for mode in ("flux-rs-w", "flux-rs-a"):  # one writer per destination at a time
        assert t[mode] <= t[mode + "-noswizzle"]
        assert t[mode] < t["sequential"]
    rs_w = next(r for r in doc["runs"] if r["mode"] == "flux-rs-w")
    # the owner's reduction reads the N blocks of its chunk (M/8 x N each, fp16) and
    # writes the chunk once: 9 x 1024 x 12288 x 2 bytes on each of the 8 GPUs
    assert rs_w["phases"]["reduce"] > 0
    per_gpu = 1024 * 12288 * 2
    assert rs_w["dram_bytes"]["rs_read"] >= 8 * 8 * per_gpu


def test_flux_ag_gemm_on_gpt3_shape_swizzle_and_tiles(emulate):
    """GPT-3 175B's AG-GEMM at TP 8 (m = 8192: gather 8192 x 12288, then 8192 x 6144 x
    12288 per rank) on 8 A100s behind NVSwitch, timing-only."""
    doc = emulate(["-n", "8", "--device", "a100-sxm", "--collective", "ag-gemm", "--topology",
                   "switch", "--m", "8192", "--n", "6144", "--k", "12288", "--timing-only",
                   "--mode", "sequential,flux-best,te-best," + ",".join(FLUX_AG)])
    t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    # flux-best: the fastest of the same configurations run on their own in this job
    best = min(FLUX_AG, key=lambda m: t[m])
    search = next(r["search"] for r in doc["runs"] if r["mode"] == "flux-best")
    assert search["chosen"] == best and t["flux-best"] == t[best]
    assert set(search["candidates_s"]) == set(FLUX_AG)  # not the TransformerEngine baseline
    assert t["flux-best"] < t["te-best"]
    assert t["flux-ag"] < t["sequential"]
    assert t["flux-ag"] < t["flux-ag-noswizzle"]  # own rows first: no wait for chunk 0
    # the exposed head is the first communication tile: smaller tiles start the GEMM
    # sooner on this shape (Flux: no size wins everywhere)
    assert t["flux-ag-tile4"] < t["flux-ag"]
    for r in doc["runs"]:
        assert r["overlap_efficiency"] is not None and r["overlap_efficiency"] < 1.0


@pytest.mark.parametrize("collective,n,k,default", [("ag-gemm", 6144, 12288, "te-ring"),
                                                   ("rs", 12288, 6144, "te-pipeline")])
def test_te_defaults_lose_to_no_overlap_at_small_m(emulate, collective, n, k, default):
    """Flux: TransformerEngine's overlap can lose to no overlap at small m. TE's default
    forms at m = 1024 on 8 A100s: the ring exchange's 8 chunk GEMMs of 128 rows each read
    all of B and pay a launch; the pipeline's 4 splits run on 16 SMs fewer. te-best is
    the fastest of TE's forms (the aggregate ring's 256-row blocks, or the P2P RS). On the
    fixed tile at the peak: under the GEMM kernel model the whole GEMM pays a partial
    wave that the chunk GEMMs' split-K avoids, and TE's ring no longer loses here."""
    doc = emulate(["-n", "8", "--device", "a100-sxm", "--collective", collective,
                   "--topology", "switch", "--m", "1024", "--n", str(n), "--k", str(k),
                   "--timing-only", "--mode", f"sequential,{default},te-best,flux-best",
                   "--set", "gpu.gemm.enabled=false"])
    t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    assert t[default] > t["sequential"]
    te = next(r for r in doc["runs"] if r["mode"] == default)
    assert te["overlap_efficiency"] < 0  # a loss
    assert len(te["phases"]) == (8 if collective == "ag-gemm" else 5)  # chunk GEMMs / splits
    assert t["te-best"] <= t[default]
    best = next(r for r in doc["runs"] if r["mode"] == "flux-best")
    assert best["speedup_vs"]["te-best"] == pytest.approx(t["te-best"] / t["flux-best"])


@pytest.mark.parametrize("per", [1, 2, 4])
def test_bf16_rs_a_across_sm80_nodes_adds_in_fp32_into_a_doubled_buffer(tmp_path, emulate, per):
    """Flux's RS-A across A100 nodes in bf16 (no bf16 atomics on sm80): fp32 atomics into a
    buffer of doubled size, each node sum narrowed to bf16 before its NIC put. On two nodes
    of 1, 2 and 4 GPUs: numerics pass against numpy + MPI (split-K 2), timing-only gives
    the same times; the GEMM's local atomics move twice fp16's bytes and the run is slower.
    Within one sm80 node, and across sm90 nodes, bf16 RS-A stays refused (Flux has no such
    path there)."""
    path = tmp_path / f"a100-nodes-{per}.toml"
    path.write_text(f"""name = "a100-nodes-{per}"\ndescription = "test"\ngpu = "a100-sxm"\n"""
                    f"""nodes = 2\ngpus_per_node = {per}\n[intra]\ntopology = "switch"\n"""
                    f"""[network]\nkind = "fabric"\nnics_per_node = 1\n"""
                    f"""nic_gb_per_s_per_direction = 25\nlatency_ns = 3000\n""")
    base = ["--system", str(path), "--collective", "rs", "--mode", "flux-rs-a", *SMALL,
            "--split-k", "2"]
    bf16 = emulate(base + ["--dtype", "bf16", "--values", "normal"])["runs"][0]
    assert bf16["numerics"] == "pass"
    timing = emulate(base + ["--dtype", "bf16", "--values", "normal", "--timing-only"])["runs"][0]
    for key in SAME:
        assert bf16[key] == timing[key], key
    fp16 = emulate(base + ["--dtype", "fp16", "--timing-only"])["runs"][0]
    assert bf16["dram_bytes"]["gemm_write"] == 2 * fp16["dram_bytes"]["gemm_write"] > 0
    assert bf16["modelled_time_s"] > fp16["modelled_time_s"]
    for where in (["--device", "a100-sxm", "-n", "2", "--topology", "switch"],
                  ["--system", "h800-2x8"]):
        proc = run_pooled(["run", *where, "--collective", "rs", "--mode", "flux-rs-a", *SMALL,
                           "--dtype", "bf16", "--timing-only"], timeout=60)
        assert proc.returncode == 2 and "no native bf16 atomics" in proc.stderr, proc.stderr


def test_rs_a_is_refused_for_a_dtype_without_native_atomics(tmp_path, emulate):
    """As on the real hardware (bf16 on A100): a device whose fp16 adds are not atomic."""
    text = (ROOT / "devices" / "presets" / "a100-sxm.toml").read_text()
    dev = tmp_path / "no-fp16-atomics.toml"
    dev.write_text(text.replace('atomic_dtypes = ["fp16", "fp32"]', 'atomic_dtypes = ["fp32"]'))
    base = ["-n", "2", "--device", str(dev), "--topology", "switch", "--collective", "rs",
            *SMALL, "--timing-only"]
    proc = run_pooled(["run", *base, "--mode", "sequential,flux-rs-a"], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "no native fp16 atomics" in proc.stderr and len(proc.stderr.splitlines()) == 1
    doc = emulate(base + ["--mode", "all"])  # all: what the device can run
    modes = [r["mode"] for r in doc["runs"]]
    assert "flux-rs-w" in modes and not any(m.startswith("flux-rs-a") for m in modes)
    best = next(r for r in doc["runs"] if r["mode"] == "flux-best")
    assert not any(m.startswith("flux-rs-a") for m in best["search"]["candidates_s"])
    assert emulate(base[:-1] + ["--dtype", "fp32", "--mode", "flux-rs-a"])["runs"][0][
        "numerics"] == "pass"
