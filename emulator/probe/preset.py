"""``t3emu probe preset``: a GPU preset from a probe's measurements.

The base preset's file (the one standing in for the probed GPU) with each value the probe
measures replaced and its source set to the probe file and the case that set it:

- ``[memory] sustained_fraction``: the largest copy kernel's bytes read and written per
  second, over the datasheet HBM rate;
- ``[memory] l2_gb_per_s``: the largest L2 re-read that fits the L2;
- ``[memory] latency_ns``: the pointer chase's time per dependent load;
- ``[gemm] mainloop_efficiency``: scaled so that the model's prediction of the largest
  square GEMM (bf16) equals its measured time;
- ``[dma] setup_ns``: the smallest copy-engine copy's time less its bytes at the measured
  HBM rate.

Only those cases set parameters (calibration); every other case, the papers' GEMM shapes
included, judges them (``t3emu probe compare``).
"""

from __future__ import annotations

import re
from pathlib import Path


def _cases(doc: dict, mech: str) -> list[dict]:
    return [c for c in doc["cases"] if c["mechanism"] == mech and "median_s" in c]


def calibrate(doc: dict, base: str) -> dict[tuple[str, str], tuple[float, str]]:
    """(section, key) -> (value, the case that set it)."""
    from devices.spec import load_device
    from emulator.model.gemm import choose

    spec = load_device(base)
    out: dict[tuple[str, str], tuple[float, str]] = {}
    copies = _cases(doc, "hbm-copy-kernel")
    rate = None
    if copies:
        c = max(copies, key=lambda c: c["bytes"])
        rate = 2.0 * c["bytes"] / c["median_s"]
        out[("memory", "sustained_fraction")] = (round(min(rate / spec.hbm_datasheet, 1.0), 4),
                                                 c["id"])
    l2 = [c for c in _cases(doc, "l2-reread") if c["bytes"] <= spec.l2_bytes]
    if l2:
        c = max(l2, key=lambda c: c["bytes"])
        out[("memory", "l2_gb_per_s")] = (round(c["bytes"] * c["rereads"] / c["median_s"] / 1e9),
                                          c["id"])
    chase = _cases(doc, "latency")
    if chase:
        c = chase[0]
        out[("memory", "latency_ns")] = (round(c["median_s"] / c["hops"] * 1e9, 1), c["id"])
    squares = [c for c in _cases(doc, "gemm") if c["m"] == c["n"] == c["k"]
               and c["dtype"] == "bf16" and spec.gemm is not None]
    if squares:
        c = max(squares, key=lambda c: c["m"])
        predicted = choose(spec, c["m"], c["n"], c["k"], 1, "bf16").predicted_s
        if predicted:
            out[("gemm", "mainloop_efficiency")] = (
                round(min(spec.gemm.mainloop_efficiency * predicted / c["median_s"], 1.0), 4),
                c["id"])
    engine = _cases(doc, "hbm-copy-engine")
    if engine and rate:
        c = min(engine, key=lambda c: c["bytes"])
        out[("dma", "setup_ns")] = (round(max(c["median_s"] - 2.0 * c["bytes"] / rate, 0.0)
                                          * 1e9), c["id"])
    return out


def _set(text: str, section: str, key: str, value: float, source: str) -> str:
    """``key = value`` in ``[section]`` of a preset's text, with a comment citing ``source``
    (the key added at the section's end if the base does not have it)."""
    sec = re.search(rf"^\[{re.escape(section)}\][^\n]*\n", text, re.M)
    if sec is None:
        return text + f"\n[{section}]\n# {source}\n{key} = {value}\n"
    start = sec.end()
    nxt = re.search(r"^\[", text[start:], re.M)
    end = start + nxt.start() if nxt else len(text)
    body = text[start:end]
    line = f"# {source}\n{key} = {value}\n"
    pat = re.compile(rf"^{re.escape(key)}\s*=.*\n", re.M)
    body = pat.sub(lambda _: line, body, count=1) if pat.search(body) else body + line
    return text[:start] + body + text[end:]


def write(doc: dict, base: str, source: str, name: str, out: Path) -> dict:
    """Write the preset; what was set, for the command's output."""
    from devices.spec import PRESET_DIR, load_device, read_toml, list_presets

    from emulator.app.files import write_text_atomic

    _, path = read_toml(base, PRESET_DIR, "device", list_presets())
    text = Path(path).read_text()
    gpu = doc.get("gpu", {}).get("name", "?")
    text = re.sub(r'^name = ".*"$', f'name = "{name}"', text, count=1, flags=re.M)
    text = re.sub(r'^description = "(.*)"$',
                  lambda m: f'description = "{gpu} as probed ({source}); else {base}: '
                            f'{m.group(1)}"', text, count=1, flags=re.M)
    values = calibrate(doc, base)
    for (section, key), (value, case) in values.items():
        text = _set(text, section, key, value,
                    f"measured: t3emu probe {source}, case {case} ({doc.get('created', '?')})")
    header = (f"# Written by `t3emu probe preset {source} --base {base}`: {base}'s file with the "
              f"values the probe measured on {gpu} (each cites its case).\n")
    write_text_atomic(out, header + text)
    load_device(str(out))  # the preset loads (every value checked as any preset's)
    return {f"{s}.{k}": v for (s, k), (v, _) in values.items()}
