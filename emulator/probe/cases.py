"""The probe's cases: each a microbenchmark a mechanism of the model predicts.

A case is a dict: ``id`` (unique, readable), ``mechanism`` (the model part it checks:
``gemm``, ``hbm-copy-kernel``, ``hbm-copy-engine``, ``l2-reread``, ``latency``,
``loaded-latency``, ``interference``, ``atomics``, ``gemv``, ``embedding-bag``) and its
parameters. The shapes are the ones the paper sweeps run on one GPU (read from the shipped
scenarios, so the probe follows them), plus square GEMMs and sizes from 1 MB to 4 GB.
``quick=True`` shrinks every case to toy sizes (the numpy backend in CI: the plumbing, not
the figures).
"""

from __future__ import annotations

MB = 1 << 20
SQUARES = (1024, 2048, 4096, 8192, 16384)
COPY_BYTES = tuple(MB << i for i in range(0, 13, 2))  # 1 MB to 4 GB, x4
L2_BYTES = (4 * MB, 16 * MB, 32 * MB)  # re-read buffers that fit every preset's L2 but A100's 40 MB
CHASE_BYTES = (256 * MB,)  # far beyond any L2: each hop a DRAM access
LOAD_INTENSITIES = (0.0, 0.25, 0.5, 0.75, 1.0)  # of the streaming kernel's CTAs per SM
INTERFERENCE_COPY_BYTES = (16 * MB, 256 * MB, 1024 * MB)
INTERFERENCE_MAX_BYTES = 2 << 30  # the GEMM-beside-its-input-copy shapes kept (seconds)
INTERFERENCE_CTAS = (8, 32, 0)  # the copy kernel's CTAs (0: one per SM... the full grid)
ATOMIC_ELEMS = (1 << 24,)
EMBEDDING_BATCHES = (256, 1024, 4096)
EMBEDDING_CTAS_PER_SM = (1, 2, 4, 8)
DTYPES = ("bf16", "fp16")
LONG_FLOPS = 1e14  # about 0.15 s a run on an H100


def _paper_gemms() -> list[tuple[str, int, int, int]]:
    """(source, M, N, K) of every GEMM one GPU runs in the paper scenarios: Flux's GPT-3
    shapes (AG and RS sides), FiCCO's GEMMs and their 8-way and 64-way decompositions
    along M, T3's sub-layers at TP 8 and 16."""
    from emulator.app.scenario import load_scenario

    out: list[tuple[str, int, int, int]] = []
    for p in load_scenario("flux-paper").points:
        out.append(("flux", p.m, p.n, p.k))
    for p in load_scenario("ficco-paper").points:
        for ways in (1, 8, 64):
            if p.m % ways == 0:
                out.append((f"ficco/{ways}", p.m // ways, p.n, p.k))
    for p in load_scenario("t3-paper").points:
        if p.tp in (8, 16):
            out.append((f"t3/tp{p.tp}", p.m, p.n, p.k))
    return list(dict.fromkeys(out))


def _fused_shapes() -> tuple[list[tuple[int, int]], list[tuple[int, int, int]]]:
    """GEMV (M, K) and embedding-bag (batch, pooling, dim) shapes of the fused-operator
    sweep."""
    from emulator.app.scenario import load_scenario

    gemv, emb = [], []
    for p in load_scenario("fused-ops-paper").points:
        if "tables" in dict(p.params):  # the embedding operator's points (M = batch, N = D,
            emb.append((p.m, p.k, p.n))  # K = pooling)
        elif p.n == 1:  # a GEMV: an M x K matrix times a vector
            gemv.append((p.m, p.k))
    return list(dict.fromkeys(gemv)), list(dict.fromkeys(emb))


E = {"fp16": 2, "bf16": 2, "fp32": 4}


def footprint_bytes(case: dict) -> int:
    """The device memory a case allocates (its inputs, outputs and buffers), so a backend
    can skip one its GPU cannot hold rather than fail in it."""
    mech, e = case["mechanism"], E.get(case.get("dtype", "fp32"), 4)
    if mech in ("gemm", "interference"):
        gemm = (case["m"] * case["k"] + case["k"] * case["n"] + case["m"] * case["n"]) * e
        return gemm + (2 * case["bytes"] if mech == "interference" else 0)
    if mech.startswith("hbm-copy"):
        return 2 * case["bytes"]
    if mech == "l2-reread":
        return case["bytes"]
    if mech in ("latency", "loaded-latency"):  # the permutation and the next-hop array
        return 2 * case["bytes"] + (2 * case["stream_bytes"] if mech == "loaded-latency" else 0)
    if mech == "atomics":  # destination, values, int64 indices
        return case["elems"] * (2 * e + 8)
    if mech == "gemv":
        return (case["m"] * case["k"] + case["m"] + case["k"]) * e
    if mech == "embedding-bag":
        return (case["rows"] + case["batch"]) * case["dim"] * e + \
            case["batch"] * case["pooling"] * 8
    return 0


def _toy(x: int, cap: int) -> int:
    return max(1, min(x, cap))


def build(quick: bool = False) -> list[dict]:
    """Every case, in the order the probe runs them."""
    cases: list[dict] = []
    g = (lambda x: _toy(x, 96)) if quick else int
    nbytes = (lambda b: _toy(b, 256 << 10)) if quick else int

    shapes = [("square", s, s, s) for s in SQUARES] + _paper_gemms()
    if quick:  # one of each source
        shapes = list({src.split("/")[0]: (src, m, n, k) for src, m, n, k in shapes}.values())
    seen = set()
    for dtype in DTYPES:
        for src, m, n, k in shapes:
            dims = (g(m), g(n), g(k))
            if (dtype, dims) in seen:
                continue
            seen.add((dtype, dims))
            cases.append({"id": f"gemm/{dtype}/{dims[0]}x{dims[1]}x{dims[2]}", "mechanism": "gemm",
                          "dtype": dtype, "m": dims[0], "n": dims[1], "k": dims[2],
                          "source": src, "flops": 2.0 * dims[0] * dims[1] * dims[2]})
    for b in COPY_BYTES[:2] if quick else COPY_BYTES:
        b = nbytes(b)
        for how in ("kernel", "engine"):
            cases.append({"id": f"hbm-copy-{how}/{b}", "mechanism": f"hbm-copy-{how}",
                          "bytes": b, "traffic_bytes": 2 * b})  # read and written
    for b in L2_BYTES[:1] if quick else L2_BYTES:
        b = nbytes(b)
        cases.append({"id": f"l2-reread/{b}", "mechanism": "l2-reread", "bytes": b,
                      "rereads": 8 if quick else 50, "traffic_bytes": b})
    for b in CHASE_BYTES:
        b = nbytes(b)
        hops = 256 if quick else 1 << 16
        cases.append({"id": f"latency/{b}", "mechanism": "latency", "bytes": b, "hops": hops})
        for load in LOAD_INTENSITIES[1:]:
            cases.append({"id": f"loaded-latency/{b}/{load:g}", "mechanism": "loaded-latency",
                          "bytes": b, "hops": hops, "load": load,
                          "stream_bytes": nbytes(1024 * MB)})
    gm = g(8192)
    # a GEMM beside a copy-engine copy of its own input (M x K): FiCCO's shard-based
    # contention runs, on the square GEMM and FiCCO's GEMMs (the model's ``ficco-cil``)
    beside = [("square", 8192, 8192, 8192)] + [
        x for x in _paper_gemms() if x[0] == "ficco/1"
        and (2 * x[1] * x[3] + x[3] * x[2] + x[1] * x[2]) * 2 <= INTERFERENCE_MAX_BYTES]
    for _, m, n, k in beside[:1] if quick else beside:
        m, n, k = g(m), g(n), g(k)
        cases.append({"id": f"interference/engine-input/{m}x{n}x{k}",
                      "mechanism": "interference", "copy": "engine", "bytes": m * k * 2,
                      "ctas": 0, "dtype": "bf16", "m": m, "n": n, "k": k})
    for b in INTERFERENCE_COPY_BYTES[:1] if quick else INTERFERENCE_COPY_BYTES:
        b = nbytes(b)
        cases.append({"id": f"interference/engine/{b}", "mechanism": "interference",
                      "copy": "engine", "bytes": b, "ctas": 0, "dtype": "bf16",
                      "m": gm, "n": gm, "k": gm})
        for ctas in INTERFERENCE_CTAS[:1] if quick else INTERFERENCE_CTAS:
            cases.append({"id": f"interference/kernel/{b}/{ctas}", "mechanism": "interference",
                          "copy": "kernel", "bytes": b, "ctas": ctas, "dtype": "bf16",
                          "m": gm, "n": gm, "k": gm})
    for elems in ATOMIC_ELEMS:
        elems = _toy(elems, 4096) if quick else elems
        for dtype in ("bf16", "fp32"):
            for how in ("atomic-add", "store"):
                cases.append({"id": f"atomics/{dtype}/{how}/{elems}", "mechanism": "atomics",
                              "dtype": dtype, "how": how, "elems": elems})
    gemv, emb = _fused_shapes()
    for m, k in gemv[:2] if quick else gemv:
        m, k = g(m), g(k)
        cases.append({"id": f"gemv/fp16/{m}x{k}", "mechanism": "gemv", "dtype": "fp16",
                      "m": m, "k": k, "traffic_bytes": 2 * m * k})
    for batch in EMBEDDING_BATCHES[:1] if quick else EMBEDDING_BATCHES:
        for ctas in EMBEDDING_CTAS_PER_SM[:2] if quick else EMBEDDING_CTAS_PER_SM:
            pooling, dim = (emb[0][1], emb[0][2]) if emb else (10, 256)
            rows = _toy(1 << 20, 4096) if quick else 1 << 20
            cases.append({"id": f"embedding-bag/{batch}/{ctas}", "mechanism": "embedding-bag",
                          "dtype": "fp32", "batch": g(batch), "pooling": pooling,
                          "dim": g(dim), "rows": rows, "ctas_per_sm": ctas})
    cases = list({c["id"]: c for c in reversed(cases)}.values())[::-1]  # (toy sizes can
    # coincide: each id once, first kept)
    # the GEMMs of more than LONG_FLOPS last: a probe whose time budget runs out loses them,
    # not a mechanism
    return sorted(cases, key=lambda c: c.get("flops", 0.0) > LONG_FLOPS)
