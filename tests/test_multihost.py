"""Several hosts: the ranks spread over 2 and 4 emulated hosts on this machine
(``t3emu run --hosts ... --same-machine``: MPICH's Hydra starts each host's ranks with
``-launcher fork`` and treats every group as a node of its own, so node-local
communicators are the groups, the HBM and tracker windows are RMA windows instead of
shared memory, and the doorbells are off). Every operation in every configuration must
pass its numerics check there with the same modelled times as on one host, and a fault
on the second host must end the job quickly, naming the rank."""

from __future__ import annotations

import json
import re
import time

import pytest

from tests.conftest import run_cli, run_pooled
from tests.ops import COLLECTIVE_ALGORITHMS, COLLECTIVES

SMALL = ["--m", "517", "--n", "300", "--k", "129"]
SAME = ("modelled_time_s", "phases", "phase_windows_s", "rank_phases_s", "rank_end_s",
        "dram_bytes", "dram_bytes_per_rank", "speedup_vs_sequential", "numerics",
        "max_abs_error")
MATRIX = [(c, a) for c in COLLECTIVES for a in COLLECTIVE_ALGORITHMS[c]]


def _run(tmp_path, name: str, args: list[str], hosts: str | None):
    out = tmp_path / f"{name}.json"
    where = ["--hosts", hosts, "--same-machine"] if hosts else []
    proc = run_pooled(["run", "-n", "4", *args, *where, "--json", str(out)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("collective,algorithm", MATRIX)
def test_every_configuration_on_two_and_four_hosts_matches_one_host(tmp_path, collective,
                                                                   algorithm):
    args = ["--collective", collective, "--algorithm", algorithm, "--topology", "full-mesh",
            "--mode", "all", *SMALL, "--dtype", "fp16"]
    one = _run(tmp_path, "one", args, None)
    assert {r["numerics"] for r in one["runs"]} == {"pass"}
    for hosts in ("n0,n1", "n0,n1,n2,n3"):
        many = _run(tmp_path, hosts.replace(",", "-"), args, hosts)
        for a, b in zip(one["runs"], many["runs"], strict=True):
            assert a["mode"] == b["mode"]
            for key in SAME:
                assert a[key] == b[key], (hosts, a["mode"], key, a[key], b[key])


@pytest.mark.parametrize("system,hosts", [("mi210-2node", "n0,n1"), ("a100-pcie-2x8", "n0,n1")])
def test_a_two_node_system_on_two_emulated_hosts_matches_one_host(tmp_path, system, hosts):
    """The emulated system's nodes as MPI's nodes: the same modelled times as on one host."""
    args = ["--system", system, "--collective", "ar", "--mode", "sequential,t3",
            "--m", "1024", "--n", "256", "--k", "64", "--dtype", "fp32"]
    runs = []
    for where in ([], ["--hosts", hosts, "--same-machine"]):
        out = tmp_path / f"{len(where)}.json"
        proc = run_pooled(["run", *args, *where, "--json", str(out)], timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        runs.append(json.loads(out.read_text())["runs"])
    for a, b in zip(*runs, strict=True):
        assert a["numerics"] == b["numerics"] == "pass"
        for key in SAME:
            assert a[key] == b[key], (system, a["mode"], key)


def _fault_time(stderr: str) -> float:
    return float(re.search(r"injected fault: .* at unix time ([0-9.]+)", stderr).group(1))


def test_sigkill_of_a_rank_on_the_second_host_ends_the_job_naming_it():
    proc = run_cli(["run", "-n", "4", "--hosts", "n0,n1", "--same-machine", "--mode", "t3",
                    *SMALL, "--inject-fault", "kill@3"], timeout=90)
    ended = time.time()
    assert proc.returncode != 0
    assert re.search(r"t3emu: .*rank 3 \(pid \d+\).* died without reporting an error",
                     proc.stderr), proc.stderr
    assert ended - _fault_time(proc.stderr) < 15


def test_exception_on_the_second_host_ends_the_job():
    t0 = time.time()
    proc = run_cli(["run", "-n", "4", "--hosts", "n0,n1", "--same-machine", "--mode", "t3",
                    *SMALL, "--inject-fault", "raise@3"], timeout=90)
    assert proc.returncode != 0
    assert "[t3emu rank 3] error" in proc.stderr and "injected fault" in proc.stderr
    assert time.time() - t0 < 30


def test_a_stall_on_the_second_host_is_named():
    proc = run_cli(["run", "-n", "4", "--hosts", "n0,n1", "--same-machine", "--mode", "t3",
                    *SMALL, "--watchdog-s", "8", "--inject-fault", "stall@3"], timeout=120)
    ended = time.time()
    assert proc.returncode != 0
    err = proc.stderr
    assert "watchdog: no completion of" in err and "within 8 s" in err, err
    stalled = re.search(r"the likely stalled ones\): ([\d, ]+)\n", err)
    assert stalled and "3" in stalled.group(1).split(", "), err
    assert re.search(r"rank 3: compute: .*stalled by an injected fault", err), err
    assert ended - _fault_time(err) < 8 + 12


def test_bad_hosts_are_refused():
    for args, word in ((["--hosts", "n0,n0"], "n0,n0"), (["--same-machine"], "--same-machine"),
                       (["--hosts", "a,b,c,d,e"], "a,b,c,d,e")):
        proc = run_cli(["run", "-n", "4", *args, *SMALL], timeout=60)
        assert proc.returncode == 2, proc.stderr
        line = proc.stderr.strip().splitlines()
        assert len(line) == 1 and word in line[0], proc.stderr
