"""Results a user can cite: every run JSON, results.json, CSV row and estimate records the
version, the commit, the code hash and the files it read, with no absolute path of this
machine; a resumed sweep refuses points made by other code or files (or keeps them,
marked, with --mixed)."""

import csv
import json
import shutil
import subprocess

from emulator.app import provenance
from tests.conftest import ROOT, run_cli

PRESET = ROOT / "devices" / "presets" / "t3-sim.toml"


def _strings(x):
    if isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)
    elif isinstance(x, str):
        yield x


def _no_machine_paths(doc, *paths):
    bad = [s for s in _strings(doc) for p in paths if str(p) in s]
    assert not bad, bad


def test_a_run_records_what_made_it_and_no_path_of_this_machine(tmp_path):
    dev = tmp_path / "my-gpu.toml"
    shutil.copy(PRESET, dev)
    out = tmp_path / "r.json"
    proc = run_cli(["run", "--timing-only", "-n", "2", "--m", "128", "--n", "128", "--k", "64",
                    "--device", str(dev), "--mode", "sequential", "--json", str(out)],
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    pv = doc["provenance"]
    from importlib.metadata import version

    assert pv["t3emu"] == version("t3emu")
    assert pv["code"] == provenance.code_hash()
    assert pv["model"] == provenance.model_hash() != pv["code"]
    if (ROOT / ".git").exists():  # a checkout: its commit, and whether it was modified
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                              capture_output=True, text=True).stdout.strip()
        assert pv["commit"] == head and isinstance(pv["clean"], bool)
    import hashlib

    assert pv["files"] == [{"role": "device", "name": "my-gpu.toml",
                            "sha256": hashlib.sha256(dev.read_bytes()).hexdigest()[:16]}]
    _no_machine_paths(doc, tmp_path, ROOT)


def test_the_code_hash_follows_the_code(tmp_path, monkeypatch):
    for d in ("emulator", "devices"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(provenance, "ROOT", tmp_path)
    provenance.code_hash.cache_clear()
    try:
        before = provenance.code_hash()
        (tmp_path / "devices" / "a.py").write_text("x = 2\n")
        provenance.code_hash.cache_clear()
        assert provenance.code_hash() != before
        (tmp_path / "devices" / "notes.md").write_text("docs do not decide a result")
        provenance.code_hash.cache_clear()
        changed = provenance.code_hash()
        (tmp_path / "devices" / "notes.md").write_text("still not")
        provenance.code_hash.cache_clear()
        assert provenance.code_hash() == changed
    finally:
        provenance.code_hash.cache_clear()


def test_a_sweep_resumed_after_its_preset_changed_is_refused_or_marked(tmp_path):
    """The first half of a sweep runs; its GPU file changes; the second half refuses to mix
    the points, or with --mixed keeps them, each marked with what made it."""
    dev = tmp_path / "gpu.toml"
    shutil.copy(PRESET, dev)
    sc = tmp_path / "half.toml"
    sc.write_text(f'''name = "half"
description = "two points"
device = "{dev}"
collective = "ar"
topology = "ring"
dtype = "fp16"
modes = ["sequential", "t3"]

[[models]]
name = "Tiny"
hidden = 512
layers = 2
seq_len = 256
batch = 2
tp = [2]
sublayers = ["OP", "FC-2"]
''')
    out = tmp_path / "out"
    args = ["sweep", str(sc), "--out", str(out), "--timing-only"]
    proc = run_cli(args, timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["provenance"]["code"] == provenance.code_hash()
    assert {f["role"] for f in doc["provenance"]["files"]} == {"scenario", "device"}
    _no_machine_paths(doc, tmp_path, ROOT)
    # the second half has not run yet: drop the last point as if the sweep had stopped
    last = doc["points"].pop()
    (out / "results.json").write_text(json.dumps(doc))
    for p in (out / "points").glob("*.json"):
        if json.loads(p.read_text())["config"]["n"] == last["n"] and \
                json.loads(p.read_text())["config"]["k"] == last["k"]:
            p.unlink()
    dev.write_text(dev.read_text().replace("link_latency_ns = 500", "link_latency_ns = 600"))
    proc = run_cli(args, timeout=300)
    assert proc.returncode == 2, proc.stderr
    line = proc.stderr.strip().splitlines()
    assert len(line) == 1 and "made by other code or files" in line[0] \
        and "device file gpu.toml differs" in line[0] and "--mixed" in line[0], proc.stderr
    proc = run_cli(args + ["--mixed"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["mixed_provenance"] is True
    shas = [next(f["sha256"] for f in pt["provenance"]["files"] if f["role"] == "device")
            for pt in doc["points"]]
    assert len(set(shas)) == 2  # each point marked with the file that made it
    with open(out / "results.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["code_hash"] for r in rows} == {provenance.code_hash()}
    assert all(r["t3emu_version"] for r in rows)


def test_the_project_is_citable():
    """CITATION.cff names this version and the four papers the README's designs cite; the
    license file and the package's metadata agree."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    cff = (ROOT / "CITATION.cff").read_text()
    assert re.search(rf'^version: "{re.escape(project["version"])}"$', cff, re.M)
    readme = (ROOT / "README.md").read_text()
    titles = re.findall(r'^\| \[[^]]+\]\([^)]+\) \| [^"|]*"([^"|]+?)\.?" ', readme, re.M)
    assert len(titles) == 4  # the design table's papers, each cited by its title
    for title in titles:
        assert f'title: "{title}"' in cff, title
    assert project["license"] == "MIT" and "MIT License" in (ROOT / "LICENSE").read_text()
    assert project["authors"] and project["classifiers"] and project["urls"]


def test_a_source_does_not_change_the_model_hash():
    """A preset's ``[sources]`` table is provenance no number reads: cut from the text the
    model hash reads, whatever table follows it; the values before it stay."""
    import tomllib

    text = (ROOT / "devices" / "presets" / "mi300x.toml").read_bytes()
    cut = provenance._without_sources(text)
    assert b"[sources]" in text and b"[sources]" not in cut
    kept, whole = tomllib.loads(cut.decode()), tomllib.loads(text.decode())
    assert "sources" not in kept and {k: v for k, v in whole.items() if k != "sources"} == kept
    moved = text.replace(b"[sources]", b"[sources]\n'x.y' = 'paper: z'", 1) + b"\n[after]\nk = 1\n"
    assert tomllib.loads(provenance._without_sources(moved).decode())["after"] == {"k": 1}
