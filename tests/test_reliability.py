"""Reliability: bad input is refused before any MPI launch, faults end the job quickly and
name the rank, corrupted data never passes, results are not lost, and nothing is left
running. The table in docs/reliability.md lists these cases."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.app.files import OutputError, check_output_dir, write_json_atomic
from tests import conftest
from tests.conftest import ROOT, run_cli

SMALL = ["--m", "517", "--n", "300", "--k", "129"]


# ---------------------------------------------------------------- bad input, before launch
BAD_RUN_OPTIONS = [
    (["-n", "0"], "-n/--ranks", "0"),
    (["-n", "-3"], "-n/--ranks", "-3"),
    (["-n", "x"], "--ranks", "x"),
    (["-n", "5000"], "-n/--ranks", "5000"),  # more memory than any laptop
    (["-n", "16", "--topology", "full-mesh"], "-n/--ranks", "16"),  # 15 links per GPU
    (["--m", "0"], "--m", "0"),
    (["--m", "-1"], "--m", "-1"),
    (["--m", "abc"], "--m", "abc"),
    (["--m", "1.5"], "--m", "1.5"),
    (["--m", "4194305"], "--m", "4194305"),
    (["--n", "10" * 15], "--n", "10" * 15),
    (["--k", "0"], "--k", "0"),
    (["--m", "3", "-n", "4"], "--m", "3"),  # fewer rows than ranks
    (["--m", "1048576", "--n", "1048576"], "--m/--n/--k", "1048576"),  # memory
    (["--m", "1048576", "--n", "1048576", "--timing-only"], "--m/--n/--k", "1048576"),
    (["--collective", "bogus"], "--collective", "bogus"),
    (["--algorithm", "tree"], "--algorithm", "tree"),
    (["--algorithm", "direct", "--topology", "ring"], "--algorithm", "direct"),
    (["--collective", "a2a", "--topology", "ring"], "--topology", "ring"),
    (["--topology", "torus"], "--topology", "torus"),
    (["--mode", "fast"], "--mode", "fast"),
    (["--mode", "t3,t3"], "--mode", "t3,t3"),
    (["--collective", "ag", "--mode", "ideal-rs-nmc"], "--mode", "ideal-rs-nmc"),
    (["--dtype", "fp8"], "--dtype", "fp8"),
    (["--device", "no-such-gpu"], "--device", "no-such-gpu"),
    (["--values", "uniform"], "--values", "uniform"),
    (["--split-k", "0"], "--split-k", "0"),
    (["--split-k", "65"], "--split-k", "65"),
    (["--seed", "-1"], "--seed", "-1"),
    (["--watchdog-s", "0"], "--watchdog-s", "0"),
    (["--watchdog-s", "inf"], "--watchdog-s", "inf"),
    (["--watchdog-s", "nan"], "--watchdog-s", "nan"),
    (["--watchdog-s", "soon"], "--watchdog-s", "soon"),
    (["--inject-fault", "explode@1"], "--inject-fault", "explode@1"),
    (["--inject-fault", "kill@4"], "--inject-fault", "kill@4"),
    (["--inject-fault", "drop-dma@1", "--timing-only"], "--inject-fault", "drop-dma@1"),
    (["--json", "/proc/no-such-dir/out.json"], "--json", "/proc/no-such-dir/out.json"),
    (["--json", "/etc/hostname/out.json"], "--json", "/etc/hostname/out.json"),
    (["--trace", "/proc/no-such-dir/t.json"], "--trace", "/proc/no-such-dir/t.json"),
    (["--bogus"], "--bogus", ""),
]


def _assert_refused(proc, option: str, value: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("t3emu: error:"), lines[0]
    assert option in lines[0] and value in lines[0], lines[0]


@pytest.mark.parametrize("args,option,value", BAD_RUN_OPTIONS,
                         ids=[" ".join(a) for a, _, _ in BAD_RUN_OPTIONS])
def test_bad_run_option_refused_before_launch(no_launch, args, option, value):
    env, marker = no_launch
    proc = run_cli(["run", *args], timeout=60, env=env)
    _assert_refused(proc, option, value)
    assert not marker.exists(), "mpiexec was started"


FICCO_AUTO = ["--collective", "ag+gemm", "--topology", "full-mesh", "--mode", "ficco-auto"]
INVERTED_PARAMS = [  # a low/high pair the wrong way round, given or with the other's default
    ([*FICCO_AUTO, "--param", "otb_low=9", "--param", "otb_high=1"], "'otb_low=9,otb_high=1'"),
    ([*FICCO_AUTO, "--param", "otb_high=1", "--param", "otb_low=9"], "'otb_low=9,otb_high=1'"),
    ([*FICCO_AUTO, "--param", "otb_low=9"], "the default otb_high = 5"),
    ([*FICCO_AUTO, "--param", "otb_high=0.5"], "the default otb_low = 1"),
    (["--collective", "ag+gemm", "--topology", "full-mesh", "--mode", "ficco-cu", "--param",
      "otb_low=9"], "'otb_low=9'"),
    (["--collective", "a2a+gemm", "--topology", "full-mesh", "--param", "otb_low=6"],
     "'otb_low=6'"),  # --mode all
]


@pytest.mark.parametrize("args,shown", INVERTED_PARAMS,
                         ids=[" ".join(a[5:]) for a, _ in INVERTED_PARAMS])
def test_inverted_params_refused_before_launch(no_launch, args, shown):
    env, marker = no_launch
    proc = run_cli(["run", *args], timeout=60, env=env)
    _assert_refused(proc, "invalid value for --param:", shown)
    line = proc.stderr.strip()
    assert "otb_low must be at most otb_high" in line, line
    assert not marker.exists(), "mpiexec was started"


def test_params_that_fit_together_are_taken():
    from emulator.app.config import RunConfig

    for params in ((("otb_low", 2.0), ("otb_high", 2.0)), (("otb_low", 5.0),),
                   (("otb_high", 1.0),)):
        RunConfig(ranks=4, collective="ag+gemm", topology="full-mesh", mode="ficco-auto",
                  params=params).validate()


def test_sweep_refuses_a_scenario_point_with_inverted_params(tmp_path, no_launch):
    env, marker = no_launch
    sc = tmp_path / "inverted.toml"
    sc.write_text((ROOT / "tests/data/tiny-ficco.toml").read_text().replace(
        'shard = "n"\n', 'shard = "n"\nparams = { otb_low = [0.5, 9] }\n', 1))
    proc = run_cli(["sweep", str(sc), "--out", str(tmp_path / "out")], timeout=60, env=env)
    _assert_refused(proc, "cases[0]: params otb_low=9:", "otb_low must be at most otb_high")
    assert "the default otb_high = 5" in proc.stderr and not marker.exists()


BAD_OTHER_COMMANDS = [
    (["sweep", "t3-paper", "--out", "{tmp}/o", "--watchdog-s", "-1"], "--watchdog-s", "-1"),
    (["sweep", "no-such-scenario", "--out", "{tmp}/o"], "scenario", "no-such-scenario"),
    (["sweep", "t3-paper"], "--out", ""),
    (["sweep", "t3-paper", "--out", "{tmp}/o", "--bogus"], "--bogus", ""),
    (["report", "{tmp}/nothing-here"], "results.json", "not found"),
    (["report", "{tmp}"], "results.json", "not found"),
]


@pytest.mark.parametrize("args,option,value", BAD_OTHER_COMMANDS,
                         ids=[" ".join(a) for a, _, _ in BAD_OTHER_COMMANDS])
def test_bad_sweep_and_report_input_refused(tmp_path, no_launch, args, option, value):
    env, marker = no_launch
    proc = run_cli([a.replace("{tmp}", str(tmp_path)) for a in args], timeout=60, env=env)
    _assert_refused(proc, option, value)
    assert not marker.exists()


def _device_file(tmp_path: Path, edit) -> Path:
    import tomllib

    doc = tomllib.loads((ROOT / "devices/presets/t3-sim.toml").read_text())
    path = tmp_path / "dev.toml"
    path.write_text(edit(doc))
    return path


def _toml(doc: dict) -> str:
    out = []
    for key in ("name", "description"):
        out.append(f"{key} = {json.dumps(doc[key])}")
    for section in ("compute", "memory", "dma", "interconnect", "executors"):
        out.append(f"[{section}]")
        for k, v in doc[section].items():
            out.append(f"{k} = {json.dumps(v)}")
    return "\n".join(out) + "\n"


def _set(section, key, value):
    def edit(doc):
        doc[section][key] = value
        return _toml(doc)
    return edit


def _drop(section, key):
    def edit(doc):
        del doc[section][key]
        return _toml(doc)
    return edit


BAD_DEVICE_FILES = [
    ("malformed", lambda doc: "name = [\n", "malformed TOML"),
    ("unknown key", _set("compute", "warp_size", 64), "warp_size"),
    ("unknown section", lambda doc: _toml(doc) + "[cooling]\nfans = 2\n", "cooling"),
    ("missing key", _drop("dma", "engines"), "engines"),
    ("wrong type", _set("compute", "cus", "eighty"), "cus"),
    ("bool for int", _set("compute", "cus", True), "cus"),
    ("zero bandwidth", _set("interconnect", "link_gb_per_s_per_direction", 0),
     "link_gb_per_s_per_direction"),
    ("zero HBM", _set("memory", "hbm_gb_per_s", 0), "hbm_gb_per_s"),
    ("negative clock", _set("compute", "clock_ghz", -1.4), "clock_ghz"),
    ("no links", _set("interconnect", "links", 0), "links"),
    ("unknown topology", _set("interconnect", "topology", "torus"), "torus"),
    ("update cheaper than a write", _set("memory", "nmc_update_cost", 0.5), "nmc_update_cost"),
    ("HBM of 1e-300 GB/s", _set("memory", "hbm_gb_per_s", 1e-300), "implausible"),
    ("HBM of 1e300 GB/s", _set("memory", "hbm_gb_per_s", 1e300), "implausible"),
    ("a clock of 1e12 GHz", _set("compute", "clock_ghz", 1e12), "clock_ghz"),
]


@pytest.mark.parametrize("value", ["1e-300", "1e300"])
def test_an_absurd_set_value_is_refused_before_launch(no_launch, value):
    env, marker = no_launch
    proc = run_cli(["run", "--device", "h800", "--set", f"gpu.memory.hbm_gb_per_s={value}"],
                   timeout=60, env=env)
    _assert_refused(proc, "--device", "implausible")
    assert not marker.exists()


@pytest.mark.parametrize("edit,word", [(e, w) for _, e, w in BAD_DEVICE_FILES],
                         ids=[n for n, _, _ in BAD_DEVICE_FILES])
def test_bad_device_file_refused_before_launch(tmp_path, no_launch, edit, word):
    env, marker = no_launch
    path = _device_file(tmp_path, edit)
    proc = run_cli(["run", "--device", str(path)], timeout=60, env=env)
    _assert_refused(proc, "--device", word)
    assert not marker.exists()


def test_sweep_refuses_points_the_device_cannot_run(tmp_path, no_launch):
    env, marker = no_launch
    sc = tmp_path / "mesh.toml"
    sc.write_text("""name = "mesh"
device = "t3-sim"
collective = "ar"
topology = "full-mesh"
dtype = "fp16"
modes = ["sequential", "t3"]
[[models]]
name = "M"
hidden = 1024
layers = 2
seq_len = 256
batch = 1
tp = [4, 16]
sublayers = ["OP"]
""")
    proc = run_cli(["sweep", str(sc), "--out", str(tmp_path / "out")], timeout=60, env=env)
    _assert_refused(proc, "-n/--ranks", "16")
    assert "TP16" in proc.stderr and not marker.exists()


def test_a_sweep_refusal_leaves_nothing_behind(tmp_path, no_launch):
    """A refusal found while the sweep checks its points (here a point the memory cannot
    hold) leaves no points/, logs/ or --out directory it made."""
    env, marker = no_launch
    sc = tmp_path / "huge.toml"
    sc.write_text((ROOT / "tests" / "data" / "tiny.toml").read_text()
                  .replace("hidden = 512", "hidden = 1048576", 1))
    out = tmp_path / "out"
    proc = run_cli(["sweep", str(sc), "--out", str(out)], timeout=60, env=env)
    assert proc.returncode == 2 and "memory" in proc.stderr, proc.stderr
    assert not out.exists() and not marker.exists()
    out.mkdir()  # a directory of the user's: kept, with nothing added
    proc = run_cli(["sweep", str(sc), "--out", str(out)], timeout=60, env=env)
    assert proc.returncode == 2 and list(out.iterdir()) == []


def test_sweep_refuses_an_unwritable_out_dir(tmp_path, no_launch):
    env, marker = no_launch
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = run_cli(["sweep", "tests/data/tiny.toml", "--out", str(blocker / "out")],
                   timeout=60, env=env)
    _assert_refused(proc, "--out", str(blocker / "out"))
    assert not marker.exists()


def test_output_checks_know_a_full_disk(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, (1 << 30) - 4096, 4096))
    with pytest.raises(OutputError, match=r"--out.*0\.0 MiB free.*need about 2 MiB"):
        check_output_dir(tmp_path, "--out", 2 << 20)


def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    write_json_atomic(path, {"points": [1, 2]})

    def full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        write_json_atomic(path, {"points": [1, 2, 3]})
    assert json.loads(path.read_text()) == {"points": [1, 2]}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]  # no temp file left


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_result_files_follow_the_umask(tmp_path, umask, mode):
    """Atomic writes (a temporary file renamed) give the mode a plain write would, not
    mkstemp's 0600, and so the shared results of a group stay readable."""
    from emulator.app.files import write_text_atomic

    old = os.umask(umask)
    try:
        write_json_atomic(tmp_path / "r.json", {"points": []})
        write_text_atomic(tmp_path / "r.csv", "a,b\n")
        write_json_atomic(tmp_path / "r.json", {"points": [1]})  # over an existing file
    finally:
        os.umask(old)
    for name in ("r.json", "r.csv"):
        assert (tmp_path / name).stat().st_mode & 0o777 == mode, (name, oct(umask))


# ---------------------------------------------------------------- faults end the job
# ------------------------------------------------ configuration files (plugins) at import
BAD_PLUGINS = [
    ("import sys\nsys.exit(0)\n", "called sys.exit(0) while loading"),
    ("raise SystemExit(3)\n", "called sys.exit(3) while loading"),
    ("import os\nos._exit(0)\n", "ended its process with exit code 0 while loading"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "was killed by signal 9"),
    ("while True:\n    pass\n", "did not finish loading within 3 s"),
    ("import time\ntime.sleep(600)\n", "did not finish loading within 3 s"),
    ("raise ValueError('bad plugin')\n", "failed to load: ValueError: bad plugin"),
]
PLUGIN_COMMANDS = [
    ["run", "-n", "2", "--timing-only", "--configs", "{plugin}"],
    ["configs", "--configs", "{plugin}"],
    ["sweep", str(ROOT / "tests" / "data" / "tiny.toml"), "--out", "{tmp}/o", "--timing-only",
     "--configs", "{plugin}"],
]


PLUGIN_CASES = ([(c, b, s) for c in PLUGIN_COMMANDS[:1] for b, s in BAD_PLUGINS]
                + [(c, b, s) for c in PLUGIN_COMMANDS[1:] for b, s in BAD_PLUGINS[2:5]])
# every file with `run`; the exits, kills and loops with `configs` and `sweep` too


@pytest.mark.parametrize("command,body,said", PLUGIN_CASES,
                         ids=[f"{c[0]}-{s.split(' while')[0][:28]}" for c, _, s in PLUGIN_CASES])
def test_a_plugin_that_exits_or_hangs_at_import_is_refused_before_launch(
        tmp_path, no_launch, command, body, said):
    """A configuration file that ends its process, raises or never finishes at import: one
    line and exit 2 within the load limit (T3EMU_PLUGIN_LOAD_S), no job started, nothing
    written; never a silent exit 0 or a hang."""
    env, marker = no_launch
    env["T3EMU_PLUGIN_LOAD_S"] = "3"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(body)
    t0 = time.time()
    proc = run_cli([a.replace("{plugin}", str(plugin)).replace("{tmp}", str(tmp_path))
                    for a in command], timeout=60, env=env)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("t3emu: error:"), proc.stderr
    assert str(plugin) in lines[0] and said in lines[0], lines[0]
    assert time.time() - t0 < 30
    assert not marker.exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("body", [
    "import os\nif os.environ.get('PMI_RANK') == '1':\n    os._exit(0)\n",
    "import os, time\nif os.environ.get('PMI_RANK') == '1':\n    time.sleep(600)\n",
], ids=["exit-0-on-rank-1", "sleep-on-rank-1"])
def test_a_plugin_that_exits_or_hangs_on_one_rank_ends_the_job(tmp_path, body):
    """The same file loads in the command and misbehaves only inside the job: the rank is
    named (exit without its marker, or the load limit on the rank), never exit 0 or a hang."""
    plugin = tmp_path / "rank_plugin.py"
    plugin.write_text(body)
    env = conftest.test_env()
    env["T3EMU_PLUGIN_LOAD_S"] = "5"
    proc = run_cli(["run", "-n", "2", "--timing-only", *SMALL, "--seed", "7121",
                    "--configs", str(plugin)], timeout=90, env=env)
    assert proc.returncode == 1, (proc.returncode, proc.stderr)
    assert re.search(r"t3emu: (.*, )?rank 1 \(pid \d+\)(, .*)? died without reporting an error",
                     proc.stderr), proc.stderr  # (a rank its proxy ended at once may be named too)
    _no_leftovers("7121")


def _leftovers(token: str) -> list[str]:
    """Processes still running whose command line holds ``token``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if token in cmd and state not in ("Z", "X"):
                out.append(cmd)
    return out


def _no_leftovers(seed: str) -> None:
    token = f"--seed {seed} "
    for _ in range(50):
        if not _leftovers(token):
            return
        time.sleep(0.1)
    raise AssertionError(f"processes left running: {_leftovers(token)}")


def _fault_time(stderr: str) -> float:
    return float(re.search(r"injected fault: .* at unix time ([0-9.]+)", stderr).group(1))


@pytest.mark.parametrize("timing_only", [False, True])
def test_sigkill_of_a_rank_ends_the_job_naming_it(timing_only):
    seed = "7101" if timing_only else "7102"
    proc = run_cli(["run", "-n", "4", "--mode", "t3", *SMALL, "--seed", seed,
                    "--inject-fault", "kill@2", *(["--timing-only"] if timing_only else [])],
                   timeout=90)
    ended = time.time()
    assert proc.returncode != 0
    assert re.search(r"t3emu: (.*, )?rank 2 \(pid \d+\)(, .*)? died without reporting an error",
                     proc.stderr), proc.stderr  # (a rank its proxy ended at once may be named too)
    assert ended - _fault_time(proc.stderr) < 15
    _no_leftovers(seed)


def test_sigkill_under_a_users_own_mpiexec_ends_the_job():
    """`mpiexec -n 4 t3emu run ...` without the launcher: Hydra's own clean-up ends it."""
    from tests.conftest import mpiexec, run_group

    proc = run_group([mpiexec(), "-n", "4", sys.executable, "-m", "mpi4py", "-m", "emulator.app.cli",
                      "run", "-n", "4", "--mode", "t3", *SMALL, "--seed", "7103",
                      "--inject-fault", "kill@1"], timeout=90)
    ended = time.time()
    assert proc.returncode != 0
    assert ended - _fault_time(proc.stderr) < 15
    _no_leftovers("7103")


@pytest.mark.parametrize("fault,where", [("raise@2", "rank 2"), ("raise-dma@1", "rank 1")])
def test_exception_on_a_rank_ends_the_job(fault, where):
    t0 = time.time()
    proc = run_cli(["run", "-n", "4", "--mode", "t3", *SMALL, "--seed", "7104",
                    "--inject-fault", fault], timeout=90)
    assert proc.returncode != 0
    assert f"[t3emu {where}] error" in proc.stderr and "injected fault" in proc.stderr
    assert time.time() - t0 < 30
    _no_leftovers("7104")


def test_an_abort_message_hydra_did_not_relay_is_printed_once(tmp_path):
    """A rank writes its abort message to stderr and to its marker, then MPI_Abort; when
    Hydra ends the job before relaying the message, the launcher prints it from the marker
    (and never twice)."""
    import io

    from emulator.app.launcher import StderrRelay

    msg = "[t3emu rank 1] error in thread dma: RuntimeError: injected fault\nTraceback ...\n"
    (tmp_path / "1.abort").write_text(msg)
    (tmp_path / "0.end").write_text("0")
    for relayed, want in (("other output\n", "other output\n" + msg), (msg, msg)):
        sink = io.StringIO()
        relay = StderrRelay(io.StringIO(relayed), sink)
        relay.start()
        relay.join()
        relay.print_lost_aborts(tmp_path)
        assert sink.getvalue() == want


@pytest.mark.parametrize("mode,timing_only", [("t3", False), ("sequential", False),
                                              ("t3", True)])
def test_a_stalled_rank_is_named_with_the_tracker_state(mode, timing_only):
    seed = {("t3", False): "7105", ("sequential", False): "7106", ("t3", True): "7107"}[
        (mode, timing_only)]
    proc = run_cli(["run", "-n", "4", "--mode", mode, *SMALL, "--seed", seed,
                    "--watchdog-s", "3", "--inject-fault", "stall@2",
                    *(["--timing-only"] if timing_only else [])], timeout=90)
    ended = time.time()
    assert proc.returncode != 0
    err = proc.stderr
    assert "watchdog: no completion of" in err and "within 3 s" in err, err
    assert re.search(r"has \d+/\d+ element-updates", err), err  # the tracker state
    stalled = re.search(r"the likely stalled ones\): ([\d, ]+)\n", err)
    assert stalled and "2" in stalled.group(1).split(", "), err
    assert re.search(r"rank 2: compute: .*stalled by an injected fault", err), err
    assert ended - _fault_time(err) < 3 + 12
    _no_leftovers(seed)


def test_a_clean_run_ends_without_a_signal_from_hydra():
    """Every rank ends through MPI_Finalize: Hydra reports no rank ended by a signal (a
    Python handler for SIGUSR1 once replaced MPICH's and let Hydra's notice kill the
    ranks still finishing)."""
    proc = run_cli(["run", "-n", "8", "--timing-only", "--mode", "sequential", *SMALL],
                   timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "TERMINATED WITH THE EXIT STRING" not in proc.stderr, proc.stderr


def test_a_rank_frozen_while_it_waits_is_named():
    """SIGSTOP of a rank that posted a wait: its heartbeat stops, the board names it
    FROZEN (a waiting rank is otherwise never among the likely stalled ones)."""
    proc = run_cli(["run", "-n", "4", "--mode", "t3", *SMALL, "--seed", "7122",
                    "--watchdog-s", "3", "--inject-fault", "freeze@2"], timeout=90)
    err = proc.stderr
    assert proc.returncode != 0
    assert "3 s without progress on any rank" in err, err
    stalled = re.search(r"the likely stalled ones\): ([\d, ]+)\n", err)
    assert stalled and stalled.group(1).split(", ") == ["2"], err
    assert re.search(r"rank 2: compute: waiting at results of t3 .*FROZEN: no heartbeat", err), err
    assert "needs a larger --watchdog-s" in err
    _no_leftovers("7122")


@pytest.mark.parametrize("timing_only", [False, True])
def test_a_slow_start_is_not_a_stall(timing_only):
    """A rank that computes for 6 s before its first run while its peers wait (a slow
    start-up on a loaded host): with --watchdog-s 2 the run passes, since CPU time of a
    busy thread is progress (before, the peers' first barrier gave up after 2 s)."""
    proc = run_cli(["run", "-n", "4", "--mode", "t3", *SMALL, "--seed", "7123",
                    "--watchdog-s", "2", "--inject-fault", "busy@1",
                    *(["--timing-only"] if timing_only else [])], timeout=90)
    assert proc.returncode == 0, proc.stderr
    assert "6 s of computation" in proc.stderr and "watchdog" not in proc.stderr
    assert ("numerics timing-only" if timing_only else "numerics pass") in proc.stderr


@pytest.mark.parametrize("command", [
    ["run"], ["sweep", "tests/data/tiny.toml", "--out", "{tmp}/o"],
    ["model", "gpt3-175b", "--system", "h800-x8"], ["nccl-tests", "h800-x8"],
    ["bench", "--quick"]], ids=["run", "sweep", "model", "nccl-tests", "bench"])
def test_every_command_that_launches_ranks_takes_watchdog_s(tmp_path, no_launch, command):
    env, marker = no_launch
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    assert "--watchdog-s" in run_cli([*args[:1], "--help"], timeout=60, env=env).stdout
    for bad in ("0", "inf", "-1"):
        proc = run_cli([*args, "--watchdog-s", bad], timeout=60, env=env)
        _assert_refused(proc, "--watchdog-s", bad.replace("inf", "inf"))
    assert not marker.exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("args,option", [
    (["-b", "0"], "-b/--min-bytes"), (["-n", "-1"], "--ranks"), (["-n", "0"], "--ranks"),
    (["-n", "16"], "-n/--ranks"), (["-b", "1K", "--json", "/proc/no-such/x.json"], "--json"),
])
def test_nccl_tests_bad_input_refused_before_launch(no_launch, args, option):
    env, marker = no_launch
    proc = run_cli(["nccl-tests", "h800-x8", *args], timeout=60, env=env)
    _assert_refused(proc, option, "")
    assert not marker.exists()


def test_a_killed_mpiexec_is_named_not_a_rank():
    seed = "7124"
    proc = subprocess.Popen([sys.executable, "-m", "emulator.app.cli", "run", "-n", "4",
                             "--mode", "t3", *SMALL, "--seed", seed, "--inject-fault",
                             "stall@1", "--watchdog-s", "600"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=conftest.test_env(),
                            cwd=ROOT, start_new_session=True, stdin=subprocess.DEVNULL)
    deadline = time.time() + 60
    hydra = []
    while time.time() < deadline and not hydra:
        time.sleep(0.5)
        hydra = [int(c.split()[0]) for c in subprocess.run(
            ["pgrep", "-af", f"mpiexec.*--seed {seed}"], capture_output=True,
            text=True).stdout.splitlines() if "pgrep" not in c]
    assert hydra
    time.sleep(3)  # the job is up, rank 1 stalled
    for pid in hydra:
        os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert re.search(r"t3emu: mpiexec \(pid \d+\) was killed by SIGKILL", err), err
    assert "died without reporting" not in err, err
    _no_leftovers(seed)


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_ctrl_c_or_sigterm_ends_a_run_and_its_ranks(how):
    """Ctrl-C in a terminal signals the whole process group; ``timeout`` or a batch
    system's stop sends SIGTERM to the launcher alone, which then stops its ranks."""
    seed = "7108" if how == "ctrl-c" else "7109"
    proc = subprocess.Popen([sys.executable, "-m", "emulator.app.cli", "run", "-n", "4", "--mode",
                             "t3", *SMALL, "--seed", seed, "--inject-fault", "stall@1",
                             "--watchdog-s", "600"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=conftest.test_env(), cwd=ROOT,
                            start_new_session=True,
                            # SIGINT handled by default, as in a terminal (a suite started in
                            # the background, `... &`, would pass it on ignored)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 60
    while "injected fault" not in (line := proc.stderr.readline()):
        assert line and time.time() < deadline, "the run did not reach the fault"
    if how == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    else:
        proc.send_signal(signal.SIGTERM)  # what timeout(1) does: the launcher alone
    t0 = time.time()
    try:
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0 and time.time() - t0 < 20
    _no_leftovers(seed)


from tests.test_model import TOY as CTRL_C_MODEL  # noqa: E402 - a toy model file


def test_the_rank_watch_ends_quietly_when_the_launcher_removed_its_directory(tmp_path):
    """An interrupt ends the launcher, which removes the ranks' directory while its watch
    still looks (seen as a thread's traceback after a Ctrl-C at start): the watch ends."""
    from emulator.app.launcher import RankWatch

    pid_dir = tmp_path / "ranks"
    pid_dir.mkdir()
    (pid_dir / "0").write_text(str(os.getpid()))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = RankWatch(str(pid_dir), proc)
        assert watch.ranks() == {0: os.getpid()}
        (pid_dir / "0").unlink()
        pid_dir.rmdir()
        watch.run()  # returns (the job still runs): no exception
        assert watch.dead == []
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("moment", [0.0, 1.0, 3.0], ids=["at-start", "after-1s", "after-3s"])
@pytest.mark.parametrize("command", ["run", "sweep", "model"])
def test_ctrl_c_exits_130_with_one_line(command, moment, tmp_path):
    """A terminal's Ctrl-C (SIGINT to the whole process group: the launcher, mpiexec and the
    ranks) at several moments of a run, a sweep and a model estimate: exit 130, one line
    saying so, no rank's traceback or MPI_Abort, no process left."""
    seed = {"run": "7111", "sweep": "7112", "model": "7113"}[command]
    model = tmp_path / "toy.toml"
    model.write_text(CTRL_C_MODEL)
    args = {"run": ["run", "-n", "4", *SMALL, "--m", "4096", "--n", "2048", "--k", "2048",
                    "--seed", seed],
            "sweep": ["sweep", str(ROOT / "tests" / "data" / "tiny.toml"), "--out",
                      str(tmp_path / "s")],
            "model": ["model", str(model), "--system", "a100-sxm-x8", "--designs", "flux",
                      "--no-cache"]}[command]
    proc = subprocess.Popen([sys.executable, "-m", "emulator.app.cli", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=conftest.test_env(), cwd=ROOT, start_new_session=True,
                            stdin=subprocess.DEVNULL,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(0.5 + moment)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = [line for line in err.splitlines() if "interrupted" in line]
    assert proc.returncode == 130, err
    assert len(said) == 1 and err.rstrip().endswith(said[0]), err
    for noise in ("Traceback", "MPI_Abort", "[t3emu rank", "BAD TERMINATION", "died without"):
        assert noise not in err + out, err
    for _ in range(50):  # nothing of the job is left in its session
        if not _in_session(proc.pid):
            break
        time.sleep(0.1)
    assert not _in_session(proc.pid)


def _in_session(sid: int) -> list[str]:
    """Processes still running in session ``sid``."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
                cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                out.append(cmd)
    return out


# ---------------------------------------------------------------- no wrong PASS
@pytest.mark.parametrize("fault,note", [
    ("drop-dma@1", "elements beyond tolerance"),
    ("double-dma@1", "elements beyond tolerance"),
    ("nan-input@2", "input A has 1 NaN, 0 Inf"),
    ("overflow@0", "Inf values"),
])
def test_corrupted_data_fails_the_numerics_check(fault, note):
    proc = run_cli(["run", "-n", "3", "--mode", "sequential,t3", *SMALL, "--dtype", "fp16",
                    "--inject-fault", fault], timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "never fired" not in proc.stderr
    assert re.search(r"^t3 .* FAIL", proc.stdout, re.M), proc.stdout
    assert "numerics FAIL in" in proc.stderr and note in proc.stderr, proc.stderr
    if fault.startswith(("drop", "double")):  # the DMA faults touch only the fused run
        assert re.search(r"^sequential .* PASS", proc.stdout, re.M), proc.stdout


# ---------------------------------------------------------------- determinism
def _modelled(doc: dict) -> list:
    return [(r["mode"], r["modelled_time_s"], r["phases"], r["rank_end_s"],
             r["dram_bytes_per_rank"], r["arbitration"]) for r in doc["runs"]]


@pytest.mark.parametrize("timing_only", [False, True])
def test_modelled_times_do_not_depend_on_cores_or_pinning(tmp_path, timing_only):
    """8 ranks on this machine's cores, all 8 squeezed onto one core, and bound to cores by
    Hydra: the modelled times, phases, per-rank ends and DRAM bytes are identical."""
    from tests.conftest import mpiexec

    args = ["run", "-n", "8", "--mode", "all", "--m", "1000", "--n", "300", "--k", "200",
            *(["--timing-only"] if timing_only else [])]
    layouts = {
        "unpinned": ({}, None),
        "one core": ({}, lambda: os.sched_setaffinity(0, {0})),
        "bound to cores": ({"T3EMU_MPIEXEC": f"{mpiexec()} -bind-to core"}, None),
    }
    seen = {}
    for name, (extra, pin) in layouts.items():
        out = tmp_path / f"{name.replace(' ', '-')}.json"
        env = {**conftest.test_env(), **extra}
        proc = run_cli([*args, "--json", str(out)], timeout=300, env=env, preexec_fn=pin)
        assert proc.returncode == 0, (name, proc.stderr)
        seen[name] = _modelled(json.loads(out.read_text()))
    first = seen["unpinned"]
    for name, got in seen.items():
        assert got == first, f"{name} differs from unpinned"


def _mpi_shm() -> set[str]:
    return {f for f in os.listdir("/dev/shm") if f.startswith("mpich")} \
        if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("fault,hosts", [
    ("kill@2", []), ("raise@1", []), ("drop-dma@1", []), ("kill@3", ["--hosts", "n0,n1",
                                                                      "--same-machine"])],
    ids=["sigkill", "exception", "numerics-fail", "sigkill-two-hosts"])
def test_an_abnormal_end_leaves_no_shared_memory_behind(fault, hosts):
    """MPI removes its /dev/shm files when it frees a window and at MPI_Finalize; a job
    that ends by MPI_Abort (an exception, a numerics FAIL) or by a killed rank leaves
    them, and the launcher removes those its ranks noted."""
    before = _mpi_shm()
    proc = run_cli(["run", "-n", "4", *hosts, "--mode", "t3", *SMALL, "--seed", "7121",
                    "--inject-fault", fault], timeout=120)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    _no_leftovers("7121")
    assert not _mpi_shm() - before, sorted(_mpi_shm() - before)


def test_a_launcher_that_is_not_on_this_machine_is_one_line(tmp_path):
    """T3EMU_MPIEXEC naming a launcher this machine lacks (srun without Slurm): one line,
    exit 2, before anything starts or is written, for run and sweep."""
    env = conftest.test_env()
    env["T3EMU_MPIEXEC"] = "no-such-launcher --mpi=pmi2"
    for args in (["run", "-n", "2", *SMALL],
                 ["sweep", str(ROOT / "tests" / "data" / "tiny.toml"), "--out",
                  str(tmp_path / "s")]):
        proc = run_cli(args, timeout=120, env=env)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1, proc.stderr
        assert "T3EMU_MPIEXEC='no-such-launcher --mpi=pmi2' names no command" in lines[0]
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("command", ["run", "model", "nccl-tests"])
def test_json_dash_writes_the_document_on_standard_output(command, tmp_path):
    """--json -: the document alone on stdout (what people read goes to stderr); no file
    named '-'."""
    model = tmp_path / "toy.toml"
    model.write_text(CTRL_C_MODEL)
    args = {"run": ["run", "-n", "2", *SMALL, "--timing-only"],
            "model": ["model", str(model), "--system", "a100-sxm-x8", "--designs", "flux",
                      "--no-cache"],
            "nccl-tests": ["nccl-tests", "mi210x4", "-b", "1K", "-e", "8K"]}[command]
    proc = run_cli([*args, "--json", "-"], timeout=600, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert not (tmp_path / "-").exists()
    said = {"run": "modelled", "model": "flux", "nccl-tests": "# Avg bus bandwidth"}[command]
    assert said in proc.stderr
    if command != "nccl-tests":
        assert doc["provenance"]["code"]
    else:
        assert len(doc["rows"]) == 2
