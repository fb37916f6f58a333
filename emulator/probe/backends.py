"""The probe's one seam to a machine: a backend measures a case and returns its times.

- ``TorchBackend``: a real GPU through PyTorch (NVIDIA CUDA, AMD ROCm: ``torch.cuda``),
  the GEMMs by the vendor BLAS (``torch.matmul``), copies by a kernel and by the driver's
  device-to-device ``memcpyAsync``, atomics by ``index_add_``; the kernels a library does
  not have (a pointer chase, a copy on a given number of CTAs, an embedding-bag at a given
  occupancy) are Triton kernels when Triton is installed (it ships with PyTorch's CUDA and
  ROCm wheels), else those cases are recorded as skipped with the reason. Timed by device
  events. ``device="cpu"`` runs the same code on the host (tests of the plumbing).
- ``NumpyBackend``: every case on the host with numpy at toy sizes, so the probe's plumbing
  (cases, timing, JSON, compare, preset) runs in CI without a GPU or PyTorch. Its figures
  describe the host, not a GPU.

``measure(case, warmup, repeats)`` returns ``{"times_s": [...]}`` plus what the case adds
(interference: each side alone and together); it raises ``Skip`` for a case the backend
cannot run.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class Skip(Exception):
    """This backend cannot run the case (the reason is recorded in the JSON)."""


def _wall(fn: Callable[[], None], warmup: int, repeats: int,
          sync: Callable[[], None] = lambda: None) -> list[float]:
    for _ in range(warmup):
        fn()
    sync()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        out.append(time.perf_counter() - t0)
    return out


class NumpyBackend:
    name = "numpy"

    def __init__(self):
        import numpy as np

        self.np = np
        self.rng = np.random.default_rng(0)

    def info(self) -> dict:
        import os
        import platform

        return {"name": f"host CPU ({platform.processor() or platform.machine()})",
                "vendor": "host", "sms": os.cpu_count(), "backend": "numpy",
                "libraries": {"numpy": self.np.__version__}}

    def _dt(self, dtype: str):
        return {"fp32": self.np.float32}.get(dtype, self.np.float32)  # host: fp32 throughout

    def measure(self, case: dict, warmup: int, repeats: int) -> dict:
        np, rng, mech = self.np, self.rng, case["mechanism"]
        if mech == "gemm":
            a = rng.standard_normal((case["m"], case["k"]), np.float32)
            b = rng.standard_normal((case["k"], case["n"]), np.float32)
            fn = lambda: a @ b  # noqa: E731
        elif mech.startswith("hbm-copy"):
            src = np.ones(case["bytes"], np.uint8)
            dst = np.empty_like(src)
            fn = lambda: np.copyto(dst, src)  # noqa: E731
        elif mech == "l2-reread":
            x = np.ones(case["bytes"] // 4, np.float32)
            fn = lambda: [x.sum() for _ in range(case["rereads"])]  # noqa: E731
        elif mech in ("latency", "loaded-latency"):
            nxt = self._ring(case["bytes"] // 8)
            hops = case["hops"]

            def chase():
                p = 0
                for _ in range(hops):
                    p = int(nxt[p])
            if mech == "latency":
                fn = chase
            else:
                return self._beside(chase, self._streamer(case["stream_bytes"]), warmup,
                                    repeats, case)
        elif mech == "interference":
            a = rng.standard_normal((case["m"], case["k"]), np.float32)
            b = rng.standard_normal((case["k"], case["n"]), np.float32)
            return self._beside(lambda: a @ b, self._streamer(case["bytes"]), warmup,
                                repeats, case, both=True)
        elif mech == "atomics":
            n = case["elems"]
            dst = np.zeros(n, np.float32)
            idx = rng.permutation(n)
            val = np.ones(n, np.float32)
            fn = ((lambda: np.add.at(dst, idx, val)) if case["how"] == "atomic-add"
                  else (lambda: dst.__setitem__(idx, val)))
        elif mech == "gemv":
            a = rng.standard_normal((case["m"], case["k"]), np.float32)
            x = rng.standard_normal(case["k"], np.float32)
            fn = lambda: a @ x  # noqa: E731
        elif mech == "embedding-bag":
            table = rng.standard_normal((case["rows"], case["dim"]), np.float32)
            idx = rng.integers(0, case["rows"], case["batch"] * case["pooling"])
            fn = lambda: table[idx].reshape(case["batch"], case["pooling"], -1).sum(1)  # noqa
        else:
            raise Skip(f"unknown mechanism {mech}")
        return {"times_s": _wall(fn, warmup, repeats)}

    def _ring(self, n: int):
        """A random cyclic permutation: nxt[p] is the next element of one cycle over all."""
        order = self.rng.permutation(n)
        nxt = self.np.empty(n, self.np.int64)
        nxt[order] = self.np.roll(order, -1)
        return nxt

    def _streamer(self, nbytes: int) -> Callable[[], None]:
        src = self.np.ones(nbytes, self.np.uint8)
        dst = self.np.empty_like(src)
        return lambda: self.np.copyto(dst, src)

    def _beside(self, main, other, warmup: int, repeats: int, case: dict,
                both: bool = False) -> dict:
        """``main`` timed alone and while a thread runs ``other`` over and over (numpy
        releases the GIL in both)."""
        alone = _wall(main, warmup, repeats)
        other_alone = _wall(other, warmup, repeats)
        stop = threading.Event()
        runs = []

        def loop():
            while not stop.is_set():
                t0 = time.perf_counter()
                other()
                runs.append(time.perf_counter() - t0)
        th = threading.Thread(target=loop, daemon=True)
        th.start()
        try:
            together = _wall(main, warmup, repeats)
        finally:
            stop.set()
            th.join()
        out = {"times_s": together, "alone_s": alone}
        if both:
            out.update(copy_alone_s=other_alone, copy_together_s=runs or other_alone)
        return out


class TorchBackend:
    """PyTorch on its GPU (``torch.cuda``: CUDA or ROCm), or on the host (``device="cpu"``)."""

    name = "torch"

    def __init__(self, device: str = "cuda"):
        import torch

        self.torch, self.device = torch, torch.device(device)
        self.gpu = self.device.type == "cuda"
        if self.gpu and not torch.cuda.is_available():
            raise Skip("PyTorch finds no GPU (torch.cuda.is_available() is False)")
        self.gen = torch.Generator(device=self.device).manual_seed(0)
        try:
            import triton  # noqa: F401

            from emulator.probe import triton_kernels

            self.tk = triton_kernels if self.gpu else None
        except ImportError:
            self.tk = None

    def info(self) -> dict:
        torch = self.torch
        libs = {"torch": torch.__version__}
        try:
            import triton

            libs["triton"] = triton.__version__
        except ImportError:
            pass
        if not self.gpu:
            return {"name": "host CPU (torch)", "vendor": "host", "backend": "torch-cpu",
                    "libraries": libs}
        p = torch.cuda.get_device_properties(self.device)
        hip = getattr(torch.version, "hip", None)
        libs["cuda" if not hip else "hip"] = torch.version.cuda or hip
        info = {"name": p.name, "vendor": "AMD" if hip else "NVIDIA", "backend": "torch",
                "sms": p.multi_processor_count, "memory_bytes": p.total_memory,
                "compute_capability": f"{p.major}.{p.minor}", "libraries": libs}
        for attr, key in (("L2_cache_size", "l2_bytes"), ("clock_rate", "clock_khz"),
                          ("memory_clock_rate", "memory_clock_khz"),
                          ("memory_bus_width", "memory_bus_bits")):
            if hasattr(p, attr):
                info[key] = getattr(p, attr)
        try:
            import subprocess

            out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,"
                                  "clocks.max.mem", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            if out:
                drv, sm, mem = [x.strip() for x in out.splitlines()[0].split(",")]
                info.update(driver=drv, max_sm_clock=sm, max_mem_clock=mem)
        except (OSError, ValueError, subprocess.SubprocessError):
            pass
        return info

    # ------------------------------------------------------------------ helpers
    def _dt(self, dtype: str):
        t = self.torch
        return {"bf16": t.bfloat16, "fp16": t.float16, "fp32": t.float32}[dtype]

    def _randn(self, shape, dtype: str):
        return self.torch.randn(shape, generator=self.gen, device=self.device,
                                dtype=self._dt(dtype))

    def _sync(self) -> None:
        if self.gpu:
            self.torch.cuda.synchronize(self.device)

    def _time(self, fn: Callable[[], None], warmup: int, repeats: int,
              stream=None) -> list[float]:
        """Device time of each call (events on the stream; the host's clock on the CPU)."""
        if not self.gpu:
            return _wall(fn, warmup, repeats)
        torch = self.torch
        stream = stream or torch.cuda.current_stream(self.device)
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                fn()
            pairs = []
            for _ in range(repeats):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record(stream)
                fn()
                b.record(stream)
                pairs.append((a, b))
        self._sync()
        return [a.elapsed_time(b) / 1e3 for a, b in pairs]

    def _copy_fn(self, how: str, nbytes: int, ctas: int = 0):
        torch = self.torch
        src = torch.ones(nbytes // 2, dtype=torch.float16, device=self.device)
        dst = torch.empty_like(src)
        if how == "engine":
            return lambda: dst.copy_(src)  # memcpyAsync device to device (the driver's engine)
        if ctas and self.tk is not None:
            return lambda: self.tk.copy(dst, src, ctas)
        if ctas:
            raise Skip("a copy kernel on a given number of CTAs needs Triton")
        return lambda: torch.neg(src, out=dst)  # an elementwise kernel: reads and writes each

    # ------------------------------------------------------------------ the cases
    def measure(self, case: dict, warmup: int, repeats: int) -> dict:
        torch, mech = self.torch, case["mechanism"]
        if self.gpu:  # a case this GPU cannot hold is skipped, not failed in
            from emulator.probe.cases import footprint_bytes

            torch.cuda.empty_cache()
            free = torch.cuda.mem_get_info(self.device)[0]
            need = footprint_bytes(case)
            if need > 0.9 * free:
                raise Skip(f"needs {need / 2**30:.1f} GiB of GPU memory; "
                           f"{free / 2**30:.1f} GiB free")
        if mech == "gemm":
            a = self._randn((case["m"], case["k"]), case["dtype"])
            b = self._randn((case["k"], case["n"]), case["dtype"])
            fn = lambda: torch.matmul(a, b)  # noqa: E731
        elif mech == "hbm-copy-kernel":
            fn = self._copy_fn("kernel", case["bytes"])
        elif mech == "hbm-copy-engine":
            fn = self._copy_fn("engine", case["bytes"])
        elif mech == "l2-reread":
            x = torch.ones(case["bytes"] // 4, dtype=torch.float32, device=self.device)
            many = x.view(1, -1).expand(case["rereads"], -1)  # one kernel, each row x again
            fn = lambda: many.sum(dim=1)  # noqa: E731
        elif mech in ("latency", "loaded-latency"):
            if self.tk is None:
                raise Skip("the pointer chase needs Triton (not installed) and a GPU")
            n = case["bytes"] // 8
            perm = torch.randperm(n, generator=self.gen, device=self.device)
            nxt = torch.empty_like(perm)
            nxt[perm] = perm.roll(-1)
            fn = lambda: self.tk.chase(nxt, case["hops"])  # noqa: E731
            if mech == "loaded-latency":
                sms = torch.cuda.get_device_properties(self.device).multi_processor_count
                load = self._copy_fn("kernel", case["stream_bytes"],
                                     max(1, int(round(case["load"] * sms))))
                return self._together(fn, load, warmup, repeats, copy_is_background=True)
        elif mech == "interference":
            a = self._randn((case["m"], case["k"]), case["dtype"])
            b = self._randn((case["k"], case["n"]), case["dtype"])
            copy = self._copy_fn(case["copy"], case["bytes"], case["ctas"])
            return self._together(lambda: torch.matmul(a, b), copy, warmup, repeats)
        elif mech == "atomics":
            n, dt = case["elems"], self._dt(case["dtype"])
            dst = torch.zeros(n, dtype=dt, device=self.device)
            idx = torch.randperm(n, generator=self.gen, device=self.device)
            val = torch.ones(n, dtype=dt, device=self.device)
            fn = ((lambda: dst.index_add_(0, idx, val)) if case["how"] == "atomic-add"
                  else (lambda: dst.index_copy_(0, idx, val)))
        elif mech == "gemv":
            a = self._randn((case["m"], case["k"]), case["dtype"])
            x = self._randn((case["k"],), case["dtype"])
            fn = lambda: torch.mv(a, x)  # noqa: E731
        elif mech == "embedding-bag":
            table = self._randn((case["rows"], case["dim"]), case["dtype"])
            idx = torch.randint(0, case["rows"], (case["batch"] * case["pooling"],),
                                generator=self.gen, device=self.device)
            if self.tk is not None:
                sms = torch.cuda.get_device_properties(self.device).multi_processor_count
                fn = lambda: self.tk.embedding_bag(table, idx, case["pooling"],  # noqa: E731
                                                   case["ctas_per_sm"] * sms)
            elif case["ctas_per_sm"] == 1:  # the library's own kernel, its own grid
                offsets = torch.arange(0, idx.numel(), case["pooling"], device=self.device)
                fn = lambda: torch.nn.functional.embedding_bag(  # noqa: E731
                    idx, table, offsets, mode="sum")
            else:
                raise Skip("an embedding-bag at a given occupancy needs Triton")
        else:
            raise Skip(f"unknown mechanism {mech}")
        return {"times_s": self._time(fn, warmup, repeats)}

    def _together(self, main, other, warmup: int, repeats: int,
                  copy_is_background: bool = False) -> dict:
        """``main`` and ``other`` each alone, then launched together on two streams: each
        side's time together (its own events) against alone."""
        torch = self.torch
        alone = self._time(main, warmup, repeats)
        other_alone = self._time(other, warmup, repeats)
        if not self.gpu:
            raise Skip("two streams need a GPU")
        s1, s2 = torch.cuda.Stream(self.device), torch.cuda.Stream(self.device)
        together, other_together = [], []
        for i in range(warmup + repeats):
            self._sync()
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            with torch.cuda.stream(s2):
                ev[2].record(s2)
                n_other = 1
                other()
                if copy_is_background:  # keep the load up for the whole of main
                    n_other = max(1, int(round(alone[len(alone) // 2] /
                                               max(other_alone[len(other_alone) // 2], 1e-9))) + 1)
                    for _ in range(n_other - 1):
                        other()
                ev[3].record(s2)
            with torch.cuda.stream(s1):
                ev[0].record(s1)
                main()
                ev[1].record(s1)
            self._sync()
            if i >= warmup:
                together.append(ev[0].elapsed_time(ev[1]) / 1e3)
                other_together.append(ev[2].elapsed_time(ev[3]) / 1e3 / n_other)
        return {"times_s": together, "alone_s": alone, "copy_alone_s": other_alone,
                "copy_together_s": other_together}


def find(name: str = "auto"):
    """The backend ``name`` (auto: PyTorch on a GPU if there is one, else numpy)."""
    if name == "numpy":
        return NumpyBackend()
    if name in ("torch", "torch-cpu"):
        try:
            return TorchBackend("cpu" if name == "torch-cpu" else "cuda")
        except ImportError:
            raise Skip("PyTorch is not installed (pip install 't3emu[gpu]')") from None
    try:
        return TorchBackend("cuda")
    except (ImportError, Skip):
        return NumpyBackend()
